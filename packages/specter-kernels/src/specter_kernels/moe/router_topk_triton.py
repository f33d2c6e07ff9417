"""Triton kernels of the fused router: the logits, then the selection.

``_router_logits_kernel``: one program per (token row, ``BLOCK_E`` experts) computes those
experts' logits as dot products over ``H``, accumulated in fixed ``BLOCK_H``-wide fp32 lanes
(the whole row of H up to 4096: one load, no loop) and summed by one fixed tree, so a
logit's bits never depend on the other rows or experts (batch-invariant by construction);
many small programs read the weight at the GPU's
bandwidth, which one program per row cannot (it measured some 20 us for DeepSeek-V2-Lite's
256 KB router weight on an H200). ``_router_one_launch_kernel`` runs it, then the
selection in the same launch: a row's logits programs take tickets from the row's arrival
counter (the split-K GEMM's per-device counters, left zeroed) and the last one reads the row's
``E`` logits, takes the softmax and the top-k (``top_k`` rounds of max, ties to the lower id),
renormalises and scales (``_select_row``). On an H200 (DeepSeek-V2-Lite, graphed steps) the
one-row draft step took 2.22-2.24 ms with the selection in the logits launch against
2.35-2.36 ms with a selection kernel of its own.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specter_kernels.invariant.matmul_triton import tile_counters
from specter_kernels.pdl import pdl_enter, pdl_options

BLOCK_E = 1
"""Experts per logits program: one program per (row, expert), 64 a row for DeepSeek-V2-Lite.
Four experts a program (16 programs a row) took 8.4 us a launch inside an H200's decode
graph: too few programs to stream even a 512 KB weight at speed."""
BLOCK_H = 4096
"""The longest stretch of H a logits program loads at once (the whole row up to 4096)."""
_ROUNDING = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


@triton.jit(do_not_specialize=["stride_x"])
def _router_logits_kernel(
    x_ptr, w_ptr, logits_ptr, H, E, stride_x,
    BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr, ROUND: tl.constexpr,
    PDL: tl.constexpr = 0,
):  # fmt: skip
    pdl_enter(PDL)  # first: with PDL, wait for the previous kernel
    row = tl.program_id(0).to(tl.int64)
    experts = tl.program_id(1) * BLOCK_E + tl.arange(0, BLOCK_E)
    live = experts < E
    lanes = tl.arange(0, BLOCK_H)
    acc = tl.zeros([BLOCK_E, BLOCK_H], dtype=tl.float32)
    for h0 in range(0, H, BLOCK_H):
        hh = h0 + lanes
        inside = hh < H
        x = tl.load(x_ptr + row * stride_x + hh, mask=inside, other=0.0).to(tl.float32)
        w = tl.load(
            w_ptr + experts[:, None].to(tl.int64) * H + hh[None, :],
            mask=live[:, None] & inside[None, :],
            other=0.0,
        ).to(tl.float32)
        acc += w * x[None, :]
    logits = tl.sum(acc, axis=1)  # [BLOCK_E]
    if ROUND == 1:
        logits = logits.to(tl.float16).to(tl.float32)
    elif ROUND == 2:
        logits = logits.to(tl.bfloat16).to(tl.float32)
    tl.store(logits_ptr + row * E + experts, logits.to(logits_ptr.dtype.element_ty), mask=live)


@triton.jit(do_not_specialize=["stride_x"])
def _router_one_launch_kernel(
    x_ptr, w_ptr, logits_ptr, weights_ptr, ids_ptr, counter_ptr, H, E, stride_x, scaling,
    BLOCK_E: tl.constexpr, BLOCK_H: tl.constexpr, ROUND: tl.constexpr,
    TOP_K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_ALL: tl.constexpr,
    RENORMALIZE: tl.constexpr, PDL: tl.constexpr = 0,
):  # fmt: skip
    """``_router_logits_kernel``, then the selection in the row's last program to finish:
    each program stores its logits and takes a ticket from the row's arrival counter; the
    one that draws the last ticket (whichever it is: the selection reads only the stored
    logits) runs the selection (``_select_row``) and sets the counter back to zero."""
    _router_logits_kernel(
        x_ptr, w_ptr, logits_ptr, H, E, stride_x, BLOCK_E, BLOCK_H, ROUND, PDL,
    )  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    # Every thread's logits are stored before the ticket; its acq_rel atomic publishes them
    # to the program that draws the last one.
    tl.debug_barrier()
    ticket = tl.atomic_add(counter_ptr + row, 1, sem="acq_rel")
    if ticket == tl.num_programs(1) - 1:
        _select_row(
            logits_ptr, weights_ptr, ids_ptr, row, E, scaling, TOP_K, BLOCK_K, BLOCK_ALL,
            RENORMALIZE,
        )  # fmt: skip
        tl.atomic_xchg(counter_ptr + row, 0)  # zeroed for the next launch


@triton.jit
def _select_row(
    logits_ptr, weights_ptr, ids_ptr, row, E, scaling,
    TOP_K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr,
    RENORMALIZE: tl.constexpr,
):  # fmt: skip
    """Row ``row``'s softmax over its ``E`` stored logits, top-k and renormalised weights."""
    experts = tl.arange(0, BLOCK_E)
    live = experts < E
    logits = tl.load(logits_ptr + row * E + experts, mask=live, other=float("-inf"))
    logits = logits.to(tl.float32)
    peak = tl.max(logits, axis=0)
    e = tl.where(live, tl.exp(logits - peak), 0.0)
    probs = e / tl.sum(e, axis=0)
    left = tl.where(live, probs, -1.0)  # padding lanes never win
    slots = tl.arange(0, BLOCK_K)
    chosen = tl.zeros([BLOCK_K], dtype=tl.float32)
    ids = tl.zeros([BLOCK_K], dtype=tl.int32)
    for k in tl.static_range(TOP_K):
        best = tl.max(left, axis=0)
        pick = tl.min(tl.where(left == best, experts, BLOCK_E), axis=0)
        chosen = tl.where(slots == k, best, chosen)
        ids = tl.where(slots == k, pick, ids)
        left = tl.where(experts == pick, -2.0, left)
    keep = slots < TOP_K
    if RENORMALIZE:
        chosen = chosen / tl.sum(tl.where(keep, chosen, 0.0), axis=0)
    chosen = chosen * scaling
    tl.store(weights_ptr + row * TOP_K + slots, chosen.to(weights_ptr.dtype.element_ty), mask=keep)
    tl.store(ids_ptr + row * TOP_K + slots, ids.to(tl.int64), mask=keep)


def router_warps(block_h: int) -> int:
    """Warps per logits program (and so the logits' reduction tree) for ``block_h`` lanes."""
    return 8 if block_h >= 2048 else 4


def launch_router_topk(
    x: torch.Tensor,
    weight: torch.Tensor,
    top_k: int,
    *,
    logits_dtype: torch.dtype,
    renormalize: bool,
    scaling: float,
    weights_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(logits [T, E], weights [T, k], ids [T, k])`` of ``x [T, H]`` (unit stride along H)
    routed by ``weight [E, H]`` (contiguous); arguments checked by ``router_topk``."""
    T, H = x.shape
    E = weight.shape[0]
    logits = torch.empty(T, E, dtype=logits_dtype, device=x.device)
    weights = torch.empty(T, top_k, dtype=weights_dtype, device=x.device)
    ids = torch.empty(T, top_k, dtype=torch.int64, device=x.device)
    block_h = max(16, min(BLOCK_H, triton.next_power_of_2(H)))
    warps = router_warps(block_h)
    block_k = max(triton.next_power_of_2(top_k), 2)
    block_all = max(triton.next_power_of_2(E), 2)
    grid = (T, triton.cdiv(E, BLOCK_E))
    _router_one_launch_kernel[grid](
        x, weight, logits, weights, ids, tile_counters(x.device, T), H, E, x.stride(0),
        scaling,
        BLOCK_E=BLOCK_E, BLOCK_H=block_h, ROUND=_ROUNDING[logits_dtype], TOP_K=top_k,
        BLOCK_K=block_k, BLOCK_ALL=block_all, RENORMALIZE=bool(renormalize), num_warps=warps,
        **pdl_options(x.device, early_trigger=True),
    )  # fmt: skip
    return logits, weights, ids
