"""Triton kernel of the MoE block's residual join with the next RMSNorm: one program per row.

``_join_rms_norm_kernel`` computes the join ``residual + (routed + shared)`` with
``routed_pair_sum_triton``'s ``_joined`` (``PAIRS``: ``routed`` the pair-order sum of the fp32
pairs, rounded once, as that module's ``JOIN`` launch; else a tensor of the dtype, the
roundings of ``residual_norm_triton``'s ``_residual_add_kernel``), stores it, then
normalises it as ``rms_norm_triton``'s kernel does: the same block, warps, fp32 lanes and
reduction tree, so the normed row has the bits ``rms_norm`` gives for the stored sum.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specter_kernels.moe.routed_pair_sum_triton import _joined
from specter_kernels.norms.rms_norm_triton import MAX_BLOCK, NUM_WARPS
from specter_kernels.pdl import pdl_enter, pdl_options


@triton.jit
def _join_rms_norm_kernel(
    routed_ptr, res_ptr, shared_ptr, w_ptr, sum_ptr, out_ptr, H, stride_pt, stride_pj, eps,
    K_PAIRS: tl.constexpr, PAIRS: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = 0,
):  # fmt: skip
    pdl_enter(PDL)  # first: with PDL, wait for the previous kernel
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    dtype = sum_ptr.dtype.element_ty
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for n0 in range(0, H, BLOCK):
        cols = n0 + offs
        keep = cols < H
        s = _joined(routed_ptr, res_ptr, shared_ptr, row, cols, keep, H, stride_pt, stride_pj,
                    K_PAIRS, PAIRS, dtype)  # fmt: skip
        tl.store(sum_ptr + row * H + cols, s.to(dtype), mask=keep)
        acc += s * s
    inv = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / H + eps)
    for n0 in range(0, H, BLOCK):
        cols = n0 + offs
        keep = cols < H
        s = _joined(routed_ptr, res_ptr, shared_ptr, row, cols, keep, H, stride_pt, stride_pj,
                    K_PAIRS, PAIRS, dtype)  # fmt: skip  # the sum again, not reread
        normed = (s * inv).to(dtype)  # back to the input's dtype, as torch
        w = tl.load(w_ptr + cols, mask=keep, other=0.0).to(tl.float32)
        y = w * normed.to(tl.float32)
        tl.store(out_ptr + row * H + cols, y.to(out_ptr.dtype.element_ty), mask=keep)


def launch_join_rms_norm(
    routed: torch.Tensor,
    residual: torch.Tensor,
    shared: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    out_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(summed [T, H], normed [T, H])``: ``residual + (routed + shared)`` and its RMSNorm
    times ``weight [H]``, with ``routed`` fp32 pairs ``[T, k, H]`` (unit column stride) or a
    ``[T, H]`` tensor of ``residual``'s dtype; ``residual`` and ``shared`` contiguous
    ``[T, H]`` (arguments checked by ``join_norm``)."""
    T, H = residual.shape
    pairs = routed.dim() == 3
    summed = torch.empty(T, H, dtype=residual.dtype, device=residual.device)
    normed = torch.empty(T, H, dtype=out_dtype, device=residual.device)
    block = min(triton.next_power_of_2(H), MAX_BLOCK)
    _join_rms_norm_kernel[(T,)](
        routed, residual, shared, weight, summed, normed, H,
        routed.stride(0) if pairs else H, routed.stride(1) if pairs else 0, eps,
        K_PAIRS=routed.shape[1] if pairs else 1, PAIRS=pairs, BLOCK=block, num_warps=NUM_WARPS,
        **pdl_options(residual.device, early_trigger=True),
    )  # fmt: skip
    return summed, normed
