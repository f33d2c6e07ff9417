"""Triton kernel of the batch-invariant matmul ``[B, M, K] x [B, K, N] -> [B, M, N]``.

Each program computes one ``[BLOCK_M, BLOCK_N]`` output tile of one batch entry
by walking its stretch of K in steps of BLOCK_K into one fp32 accumulator. The tile
shape and the split of K come from :func:`matmul_config`, which looks at (N, K, dtype)
only, so the reduction order of every output element is the same whatever M and B
are: a row's result does not depend on the rows beside it.

With ``split_k = S > 1`` (decode-sized GEMVs whose N alone gives too few programs to
stream the weight at full bandwidth) K is cut into S fixed stretches of
``k_split`` columns; program ``s`` writes its fp32 partial sums to a workspace
``[B, S, M, N]`` and a second kernel adds the S partials in the order 0, 1, ..., S-1,
adds the bias and rounds once. The stretches and that order depend on (N, K, dtype)
only, so split-K keeps the kernel batch-invariant (unlike cuBLAS's split-K, chosen
by M).
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
@triton.jit(
    do_not_specialize=["M", "stride_ab", "stride_am", "stride_cb", "stride_cm", "stride_cs"]
)
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
    stride_cs,
    k_split,
    HAS_BIAS: tl.constexpr,
    IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1) // SPLIT_K
    split = tl.program_id(1) % SPLIT_K
    batch = tl.program_id(2).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    a_rows = a_ptr + batch * stride_ab + offs_m.to(tl.int64)[:, None] * stride_am
    b_cols = b_ptr + batch * stride_bb + offs_n.to(tl.int64)[None, :] * stride_bn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    k_begin = split * k_split
    k_end = tl.minimum(k_begin + k_split, K)
    for k0 in range(k_begin, k_end, BLOCK_K):
        kk = k0 + offs_k
        k_mask = kk < k_end
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
    c = c_ptr + batch * stride_cb + offs_m.to(tl.int64)[:, None] * stride_cm
    c = c + offs_n.to(tl.int64)[None, :] * stride_cn
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])
    else:
        # c is the fp32 workspace [B, S, M, N]; stride_cs steps between partials.
        tl.store(c + split * stride_cs, acc, mask=m_mask[:, None] & n_mask[None, :])


@triton.jit(do_not_specialize=["M", "stride_wb", "stride_wm", "stride_cb", "stride_cm"])
def _split_k_sum_kernel(
    w_ptr,
    bias_ptr,
    c_ptr,
    M,
    N,
    stride_wb,
    stride_ws,
    stride_wm,
    stride_cb,
    stride_cm,
    stride_cn,
    HAS_BIAS: tl.constexpr,
    SPLIT_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """``c[b, m, n] = sum_{s = 0..S-1} w[b, s, m, n] (+ bias[n])`` in that order, rounded once."""
    row = tl.program_id(0).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    batch = tl.program_id(2).to(tl.int64)
    n_mask = offs_n < N
    w = w_ptr + batch * stride_wb + row * stride_wm + offs_n
    acc = tl.load(w, mask=n_mask, other=0.0)
    for s in tl.static_range(1, SPLIT_K):
        acc += tl.load(w + s * stride_ws, mask=n_mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    c = c_ptr + batch * stride_cb + row * stride_cm + offs_n.to(tl.int64) * stride_cn
    tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=n_mask)


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
    split = c.split_k if c.block_k < K else 1
    # Each stretch is a whole number of BLOCK_K steps, so a split only cuts where the
    # unsplit kernel's steps end; the last stretch may be shorter (or empty).
    k_split = triton.cdiv(triton.cdiv(K, split), c.block_k) * c.block_k
    grid = (triton.cdiv(M, c.block_m), triton.cdiv(N, c.block_n) * split, B)
    if split == 1:
        target, strides = out, (out.stride(0), out.stride(1), out.stride(2), 0)
    else:
        target = torch.empty(B, split, M, N, dtype=torch.float32, device=a.device)
        strides = (target.stride(0), target.stride(2), target.stride(3), target.stride(1))
    _invariant_matmul_kernel[grid](
        a, b, bias if bias is not None else out, target,
        M, N, K,
        a.stride(0), a.stride(1), a.stride(2),
        b.stride(0), b.stride(1), b.stride(2),
        *strides, k_split,
        HAS_BIAS=bias is not None and split == 1, IEEE=a.dtype == torch.float32,
        BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, SPLIT_K=split,
        num_warps=c.num_warps, num_stages=c.num_stages,
    )  # fmt: skip
    if split > 1:
        block = min(1024, triton.next_power_of_2(N))
        _split_k_sum_kernel[(M, triton.cdiv(N, block), B)](
            target, bias if bias is not None else out, out,
            M, N,
            target.stride(0), target.stride(1), target.stride(2),
            out.stride(0), out.stride(1), out.stride(2),
            HAS_BIAS=bias is not None, SPLIT_K=split, BLOCK_N=block,
        )  # fmt: skip
    return out
