"""Triton kernel of ``sum_routed_pairs`` and ``residual_add_routed_pairs``: one program per
(row, block of ``BLOCK`` columns).

Each program adds the ``k`` fp32 pair rows of its token in pair order (``j = 0 .. k-1``,
one IEEE fp32 add each, as torch's ``clone`` then ``+=`` do) and rounds the sum once to the
output dtype: one launch in place of the ``k + 1`` (and a cast) of the torch form, with the
same bits. With ``JOIN`` it then goes on as ``residual_norm``'s ``_residual_add_kernel``
does with the rounded sum as its ``a``: ``residual + (routed +
shared)``, each add in fp32 rounded to the dtype, as torch's two adds round. No multiply is
involved, so there is nothing to contract.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specter_kernels.pdl import pdl_enter, pdl_options

MAX_BLOCK = 1024


@triton.jit
def _joined(
    routed_ptr, res_ptr, shared_ptr, row, cols, keep, H, stride_pt, stride_pj,
    K_PAIRS: tl.constexpr, PAIRS: tl.constexpr, DTYPE: tl.constexpr,
):  # fmt: skip
    """fp32 ``[BLOCK]``: the row's join ``residual + (routed + shared)`` at ``cols``, each add
    rounded to ``DTYPE`` as torch's: ``routed`` the pair-order sum of fp32 pairs (``PAIRS``)
    or a ``[T, H]`` tensor of the dtype. The ``JOIN`` launch here and ``join_norm_triton``
    both compute it so."""
    if PAIRS:
        total = _pair_sum(routed_ptr + row * stride_pt + cols, keep, stride_pj, K_PAIRS)
        routed = total.to(DTYPE).to(tl.float32)  # sum_routed_pairs' result
    else:
        routed = tl.load(routed_ptr + row * H + cols, mask=keep, other=0.0).to(tl.float32)
    shared = tl.load(shared_ptr + row * H + cols, mask=keep, other=0.0).to(tl.float32)
    inner = (routed + shared).to(DTYPE).to(tl.float32)
    r = tl.load(res_ptr + row * H + cols, mask=keep, other=0.0).to(tl.float32)
    return (r + inner).to(DTYPE).to(tl.float32)


@triton.jit
def _pair_sum(first, keep, stride_pj, K_PAIRS: tl.constexpr):
    """fp32 ``[BLOCK]``: the ``K_PAIRS`` pair rows from ``first`` added in pair order."""
    total = tl.load(first, mask=keep, other=0.0)
    for j in tl.static_range(1, K_PAIRS):
        total += tl.load(first + j * stride_pj, mask=keep, other=0.0)
    return total


@triton.jit
def _routed_pair_sum_kernel(
    pairs_ptr, res_ptr, shared_ptr, out_ptr, H, stride_pt, stride_pj,
    K_PAIRS: tl.constexpr, BLOCK: tl.constexpr, JOIN: tl.constexpr = 0, PDL: tl.constexpr = 0,
):  # fmt: skip
    pdl_enter(PDL)  # first: with PDL, wait for the previous kernel
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    keep = cols < H
    dtype = out_ptr.dtype.element_ty
    if JOIN:  # residual + (routed + shared), each add rounded as torch's
        total = _joined(pairs_ptr, res_ptr, shared_ptr, row, cols, keep, H, stride_pt,
                        stride_pj, K_PAIRS, True, dtype)  # fmt: skip
    else:
        total = _pair_sum(pairs_ptr + row * stride_pt + cols, keep, stride_pj, K_PAIRS)
    tl.store(out_ptr + row * H + cols, total.to(dtype), mask=keep)


def launch_routed_pair_sum(
    pairs: torch.Tensor,
    dtype: torch.dtype,
    residual: torch.Tensor | None = None,
    shared: torch.Tensor | None = None,
) -> torch.Tensor:
    """``[T, H]`` in ``dtype``: the pair-order sum of ``pairs`` fp32 ``[T, k, H]`` (unit
    column stride), rounded once; given contiguous ``residual`` and ``shared`` ``[T, H]`` in
    ``dtype``, ``residual + (that sum + shared)`` instead (the ``JOIN`` kernel)."""
    T, k, H = pairs.shape
    out = torch.empty(T, H, dtype=dtype, device=pairs.device)
    join = residual is not None
    block = min(triton.next_power_of_2(H), MAX_BLOCK)
    _routed_pair_sum_kernel[(T, triton.cdiv(H, block))](
        pairs, residual if join else out, shared if join else out, out, H,
        pairs.stride(0), pairs.stride(1), K_PAIRS=k, BLOCK=block, JOIN=int(join), num_warps=4,
        **pdl_options(pairs.device, early_trigger=True),
    )  # fmt: skip
    return out
