"""Triton kernel of the batch-invariant softmax and log-softmax: one program per row, one launch.

The composed form (``amax``, subtract, ``exp``, the invariant row sum, divide, casts) costs
seven launches per softmax; a verification forward runs two softmaxes per layer (the
router's and attention's), so on the GPU this kernel does the whole row in one. It keeps the
row sum's fixed layout (:mod:`specter_kernels.invariant.row_sum_triton`): lane ``l`` of a
``ROW_SUM_BLOCK``-wide fp32 accumulator adds elements ``l, l + BLOCK, ...`` in order, then
one fixed tree sums the lanes. Nothing depends on the number of rows, and a row padded with
``-inf`` (masked attention keys past the filled length) gives exactly the unpadded row's
values: its padding adds ``exp(-inf) = 0`` to the lanes.

Three passes over the row: the maximum (exact in any order), the sum of ``exp(x - max)``,
then ``exp(x - max) / sum`` (or ``x - max - log(sum)``) in the output dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specter_kernels.invariant.row_sum_triton import ROW_SUM_BLOCK, ROW_SUM_WARPS
from specter_kernels.pdl import pdl_enter, pdl_options


@triton.jit(do_not_specialize=["stride_xr", "stride_or"])
def _invariant_softmax_kernel(
    x_ptr,
    out_ptr,
    N,
    stride_xr,
    stride_xn,
    stride_or,
    stride_on,
    BLOCK: tl.constexpr,
    LOG: tl.constexpr,
    ZERO_MASKED_ROWS: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    pdl_enter(PDL)  # first: with PDL, wait for the previous kernel
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    x_row = x_ptr + row * stride_xr
    out_row = out_ptr + row * stride_or
    top = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    for n0 in range(0, N, BLOCK):
        nn = n0 + offs
        x = tl.load(x_row + nn.to(tl.int64) * stride_xn, mask=nn < N, other=float("-inf"))
        top = tl.maximum(top, x.to(tl.float32))
    row_max = tl.max(top, axis=0)
    if ZERO_MASKED_ROWS:  # an all -inf row: exp(-inf) = 0 instead of NaN
        row_max = tl.where(row_max == float("-inf"), 0.0, row_max)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for n0 in range(0, N, BLOCK):
        nn = n0 + offs
        x = tl.load(x_row + nn.to(tl.int64) * stride_xn, mask=nn < N, other=float("-inf"))
        acc += tl.exp(x.to(tl.float32) - row_max)
    total = tl.sum(acc, axis=0)
    for n0 in range(0, N, BLOCK):
        nn = n0 + offs
        mask = nn < N
        x = tl.load(x_row + nn.to(tl.int64) * stride_xn, mask=mask, other=float("-inf"))
        shifted = x.to(tl.float32) - row_max
        if LOG:
            out = shifted - tl.log(total)
        else:
            out = tl.exp(shifted) / total
            if ZERO_MASKED_ROWS:
                out = tl.where(total == 0.0, 0.0, out)
        tl.store(out_row + nn.to(tl.int64) * stride_on, out.to(out_ptr.dtype.element_ty), mask=mask)


def launch_invariant_softmax(
    rows: torch.Tensor, log: bool, zero_masked_rows: bool, out_dtype: torch.dtype
) -> torch.Tensor:
    """Softmax (or log-softmax) of each row of ``rows [R, N]`` (any strides): ``[R, N]``."""
    R, N = rows.shape
    out = torch.empty(R, N, dtype=out_dtype, device=rows.device)
    _invariant_softmax_kernel[(R,)](
        rows, out, N,
        rows.stride(0), rows.stride(1), out.stride(0), out.stride(1),
        BLOCK=ROW_SUM_BLOCK, LOG=log, ZERO_MASKED_ROWS=zero_masked_rows,
        num_warps=ROW_SUM_WARPS,
        **pdl_options(rows.device, early_trigger=True),
    )  # fmt: skip
    return out
