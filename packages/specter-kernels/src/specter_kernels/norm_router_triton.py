"""Triton kernel of ``add_rms_norm_router_topk``: the residual add, the RMSNorm and the
router in one launch (see ``norm_router``).

One program per (token row, expert), as the router's logits launch. Each program loads its
expert's router row before the PDL wait (a weight no kernel of the step writes), then the
row's two inputs, and computes the rounded sum and its RMSNorm with ``add_rms_norm``'s block,
warps, fp32 lanes and reduction tree (so every program holds the same normed row, with the
bits ``add_rms_norm`` gives it); the expert-0 program stores the sum and the normed row.
Each program's logit is then the router's: fp32 products over the same lanes, the same
reduction, rounded to the logits' dtype. The row's last program to take a ticket from its
arrival counter selects (``router_topk_triton._select_row``) and zeroes the counter.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specter_kernels.pdl import pdl_enter, pdl_options
from specter_kernels.rms_norm_triton import NUM_WARPS
from specter_kernels.router_topk_triton import _ROUNDING, _select_row

MAX_HIDDEN = 4096
"""The widest row the one launch takes: one block of lanes, as ``rms_norm``'s and the
router's (their ``MAX_BLOCK`` and ``BLOCK_H``); wider rows take the two launches."""


@triton.jit(do_not_specialize=["stride_xr", "stride_rr"])
def _add_norm_router_kernel(
    x_ptr, res_ptr, norm_w_ptr, sum_ptr, normed_ptr, gate_w_ptr, logits_ptr, weights_ptr,
    ids_ptr, counter_ptr, H, E, stride_xr, stride_rr, eps, scaling,
    BLOCK: tl.constexpr, ROUND: tl.constexpr, TOP_K: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_ALL: tl.constexpr, RENORMALIZE: tl.constexpr, PDL: tl.constexpr = 0,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    expert = tl.program_id(1)
    lanes = tl.arange(0, BLOCK)
    inside = lanes < H
    # The router's weight: constant through the step, so loaded before the wait.
    gate_w = tl.load(
        gate_w_ptr + expert.to(tl.int64) * H + lanes[None, :], mask=inside[None, :], other=0.0
    ).to(tl.float32)  # [1, BLOCK]
    pdl_enter(PDL)  # with PDL, wait for the previous kernel before reading its outputs
    # add_rms_norm's arithmetic (one block: its loop runs once).
    x = tl.load(x_ptr + row * stride_xr + lanes, mask=inside, other=0.0).to(tl.float32)
    r = tl.load(res_ptr + row * stride_rr + lanes, mask=inside, other=0.0).to(tl.float32)
    s = (r + x).to(sum_ptr.dtype.element_ty)  # rounded, as torch's add rounds it
    first = inside & (expert == 0)
    tl.store(sum_ptr + row * H + lanes, s, mask=first)
    s = s.to(tl.float32)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    acc += s * s
    inv = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / H + eps)
    normed = (s * inv).to(sum_ptr.dtype.element_ty)  # back to the input's dtype, as torch
    w = tl.load(norm_w_ptr + lanes, mask=inside, other=0.0).to(tl.float32)
    y = (w * normed.to(tl.float32)).to(normed_ptr.dtype.element_ty)
    tl.store(normed_ptr + row * H + lanes, y, mask=first)
    # The router's logit of this expert, on the normed row as stored.
    products = tl.zeros([1, BLOCK], dtype=tl.float32)
    products += gate_w * y.to(tl.float32)[None, :]
    logit = tl.sum(products, axis=1)  # [1]
    if ROUND == 1:
        logit = logit.to(tl.float16).to(tl.float32)
    elif ROUND == 2:
        logit = logit.to(tl.bfloat16).to(tl.float32)
    expert_lane = expert + tl.arange(0, 1)
    tl.store(logits_ptr + row * E + expert_lane, logit.to(logits_ptr.dtype.element_ty))
    # Every thread's logit is stored before the ticket; its acq_rel atomic publishes them to
    # the program that draws the last one.
    tl.debug_barrier()
    ticket = tl.atomic_add(counter_ptr + row, 1, sem="acq_rel")
    if ticket == E - 1:
        _select_row(
            logits_ptr, weights_ptr, ids_ptr, row, E, scaling, TOP_K, BLOCK_K, BLOCK_ALL,
            RENORMALIZE,
        )  # fmt: skip
        tl.atomic_xchg(counter_ptr + row, 0)  # zeroed for the next launch


def launch_add_norm_router(
    x: torch.Tensor,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    gate_weight: torch.Tensor,
    top_k: int,
    *,
    normed_dtype: torch.dtype,
    logits_dtype: torch.dtype,
    renormalize: bool,
    scaling: float,
    weights_dtype: torch.dtype,
) -> tuple[torch.Tensor, ...]:
    """``(summed [T, H], normed [T, H], logits [T, E], weights [T, k], ids [T, k])`` of rows
    ``x``, ``residual`` ``[T, H]`` (unit stride along H, H <= :data:`MAX_HIDDEN`);
    arguments checked by ``add_rms_norm_router_topk``."""
    from specter_kernels.invariant_matmul_triton import tile_counters

    T, H = x.shape
    E = gate_weight.shape[0]
    device = x.device
    summed = torch.empty(T, H, dtype=x.dtype, device=device)
    normed = torch.empty(T, H, dtype=normed_dtype, device=device)
    logits = torch.empty(T, E, dtype=logits_dtype, device=device)
    weights = torch.empty(T, top_k, dtype=weights_dtype, device=device)
    ids = torch.empty(T, top_k, dtype=torch.int64, device=device)
    _add_norm_router_kernel[(T, E)](
        x, residual, norm_weight, summed, normed, gate_weight, logits, weights, ids,
        tile_counters(device, T), H, E, x.stride(0), residual.stride(0), eps, scaling,
        BLOCK=triton.next_power_of_2(H), ROUND=_ROUNDING[logits_dtype], TOP_K=top_k,
        BLOCK_K=max(triton.next_power_of_2(top_k), 2),
        BLOCK_ALL=max(triton.next_power_of_2(E), 2), RENORMALIZE=bool(renormalize),
        num_warps=NUM_WARPS, **pdl_options(device, early_trigger=True),
    )  # fmt: skip
    return summed, normed, logits, weights, ids
