"""Triton kernel of the batch-invariant matmul ``[B, M, K] x [B, K, N] -> [B, M, N]``.

Each program computes one ``[BLOCK_M, BLOCK_N]`` output tile of one batch entry
by walking K from 0 to K in steps of BLOCK_K into one fp32 accumulator. There is
no split-K and the tile shape comes from :func:`matmul_config`, which looks at
(N, K, dtype) only, so the reduction order of every output element is the same
whatever M and B are: a row's result does not depend on the rows beside it.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from specter_kernels.invariant_matmul_config import MatmulConfig, matmul_config


# M and the batch stride vary with the number of rows; specialising on them
# (Triton treats 1 and multiples of 16 specially) would compile a different
# kernel per row count, which is exactly what this kernel must not do.
@triton.jit(do_not_specialize=["M", "stride_ab", "stride_am", "stride_cb", "stride_cm"])
def _invariant_matmul_kernel(
    a_ptr,
    b_ptr,
    bias_ptr,
    c_ptr,
    M,
    N,
    K,
    stride_ab,
    stride_am,
    stride_ak,
    stride_bb,
    stride_bk,
    stride_bn,
    stride_cb,
    stride_cm,
    stride_cn,
    HAS_BIAS: tl.constexpr,
    IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    batch = tl.program_id(2).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    a_rows = a_ptr + batch * stride_ab + offs_m.to(tl.int64)[:, None] * stride_am
    b_cols = b_ptr + batch * stride_bb + offs_n.to(tl.int64)[None, :] * stride_bn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        k_mask = kk < K
        # Masked lanes load zeros, so K below 16 or not a multiple of BLOCK_K
        # (rotary's K=1) still feeds tl.dot a full tile.
        a = tl.load(
            a_rows + kk.to(tl.int64)[None, :] * stride_ak,
            mask=m_mask[:, None] & k_mask[None, :],
            other=0.0,
        )
        b = tl.load(
            b_cols + kk.to(tl.int64)[:, None] * stride_bk,
            mask=k_mask[:, None] & n_mask[None, :],
            other=0.0,
        )
        if IEEE:
            acc = tl.dot(a, b, acc, input_precision="ieee")  # fp32: no TF32 rounding
        else:
            acc = tl.dot(a, b, acc)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
    c = c_ptr + batch * stride_cb + offs_m.to(tl.int64)[:, None] * stride_cm
    tl.store(
        c + offs_n.to(tl.int64)[None, :] * stride_cn,
        acc.to(c_ptr.dtype.element_ty),
        mask=m_mask[:, None] & n_mask[None, :],
    )


@functools.cache
def _device_name(device: torch.device) -> str | None:
    """The GPU model's name (tuned tiles are per model); None off CUDA."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else None


def launch_invariant_bmm(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    bias: torch.Tensor | None = None,
    config: MatmulConfig | None = None,
) -> torch.Tensor:
    """Run the kernel on validated ``a [B, M, K]``, ``b [B, K, N]`` into ``out [B, M, N]``."""
    B, M, K = a.shape
    N = b.shape[2]
    c = config or matmul_config(N, K, a.dtype, _device_name(a.device))
    grid = (triton.cdiv(M, c.block_m), triton.cdiv(N, c.block_n), B)
    _invariant_matmul_kernel[grid](
        a, b, bias if bias is not None else out, out,
        M, N, K,
        a.stride(0), a.stride(1), a.stride(2),
        b.stride(0), b.stride(1), b.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        HAS_BIAS=bias is not None, IEEE=a.dtype == torch.float32,
        BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k,
        num_warps=c.num_warps, num_stages=c.num_stages,
    )  # fmt: skip
    return out
