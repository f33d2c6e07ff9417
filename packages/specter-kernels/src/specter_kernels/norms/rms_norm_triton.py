"""Triton kernel of the fused RMSNorm: one program per row, one launch per norm.

The sum of squares runs over fixed ``BLOCK``-wide fp32 lanes (``BLOCK`` depends on N
only) and one fixed tree, so a row's result never depends on how many rows come with it:
the kernel is batch-invariant by construction.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specter_kernels.pdl import pdl_enter, pdl_options

MAX_BLOCK = 4096
NUM_WARPS = 8


@triton.jit(do_not_specialize=["stride_xr", "stride_or"])
def _rms_norm_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    N,
    stride_xr,
    stride_or,
    eps,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    pdl_enter(PDL)  # first: with PDL, wait for the previous kernel
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    x_row = x_ptr + row * stride_xr
    out_row = out_ptr + row * stride_or
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for n0 in range(0, N, BLOCK):
        nn = n0 + offs
        x = tl.load(x_row + nn, mask=nn < N, other=0.0).to(tl.float32)
        acc += x * x
    inv = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / N + eps)
    for n0 in range(0, N, BLOCK):
        nn = n0 + offs
        keep = nn < N
        x = tl.load(x_row + nn, mask=keep, other=0.0).to(tl.float32)
        normed = (x * inv).to(x_ptr.dtype.element_ty)  # back to the input's dtype, as torch
        w = tl.load(w_ptr + nn, mask=keep, other=0.0).to(tl.float32)
        y = w * normed.to(tl.float32)
        tl.store(out_row + nn, y.to(out_ptr.dtype.element_ty), mask=keep)


def launch_rms_norm(
    rows: torch.Tensor, weight: torch.Tensor, eps: float, out_dtype: torch.dtype
) -> torch.Tensor:
    """``[R, N]`` normed rows of ``rows [R, N]`` (unit stride along N) times ``weight [N]``."""
    R, N = rows.shape
    out = torch.empty(R, N, dtype=out_dtype, device=rows.device)
    block = min(triton.next_power_of_2(N), MAX_BLOCK)
    _rms_norm_kernel[(R,)](
        rows, weight, out, N, rows.stride(0), out.stride(0), eps, BLOCK=block,
        num_warps=NUM_WARPS,
        **pdl_options(rows.device, early_trigger=True),
    )  # fmt: skip
    return out
