"""Triton kernel of the batch-invariant row sum: one program per row.

Lane ``l`` of a fixed ``ROW_SUM_BLOCK``-wide fp32 accumulator adds elements
``l, l + BLOCK, l + 2 BLOCK, ...`` of its row in order, then one fixed tree sums
the lanes. Nothing depends on the number of rows, and since the block does not
depend on N either, a row padded with zeros (masked attention keys) sums to
exactly what the unpadded row does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specter_kernels.pdl import pdl_enter, pdl_options

ROW_SUM_BLOCK = 1024
ROW_SUM_WARPS = 4


@triton.jit(do_not_specialize=["stride_xr"])
def _invariant_row_sum_kernel(
    x_ptr, out_ptr, N, stride_xr, stride_xn, BLOCK: tl.constexpr, PDL: tl.constexpr = 0
):
    pdl_enter(PDL)  # first: with PDL, wait for the previous kernel
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    x_row = x_ptr + row * stride_xr
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for n0 in range(0, N, BLOCK):
        nn = n0 + offs
        acc += tl.load(x_row + nn.to(tl.int64) * stride_xn, mask=nn < N, other=0.0).to(tl.float32)
    tl.store(out_ptr + row, tl.sum(acc, axis=0))


def launch_invariant_row_sum(rows: torch.Tensor) -> torch.Tensor:
    """fp32 sums ``[R]`` of the rows of ``rows [R, N]`` (any strides)."""
    R, N = rows.shape
    out = torch.empty(R, dtype=torch.float32, device=rows.device)
    _invariant_row_sum_kernel[(R,)](
        rows,
        out,
        N,
        rows.stride(0),
        rows.stride(1),
        BLOCK=ROW_SUM_BLOCK,
        num_warps=ROW_SUM_WARPS,
        **pdl_options(rows.device, early_trigger=True),
    )
    return out
