"""Triton kernel of the last-dim argmax, and its launcher.

``_argmax_kernel``: one program per (row, ``BLOCK``-wide stretch of the row) finds its
stretch's winner (the first NaN if it holds one, else the largest value's first index),
stores it as a partial and takes a ticket from the row's arrival counter; the program that
draws the last ticket merges the row's partials in stretch order (a NaN partial wins, then
the largest value, ties to the earlier stretch, whose index is lower) and sets the counter
back to zero (the counters are the device's split-launch ``tile_counters``, as the router's,
which every launch leaves at zero). So the result is ``torch.argmax``'s: NaN counts as the
largest value and ties go to the lowest index.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specter_kernels.invariant.matmul_triton import tile_counters
from specter_kernels.pdl import pdl_enter, pdl_options

BLOCK = 4096
"""Values per program: 25 programs for DeepSeek-V2-Lite's 102400-token vocabulary."""
NUM_WARPS = 4


@triton.jit
def _argmax_kernel(
    x_ptr, part_val_ptr, part_idx_ptr, out_ptr, counter_ptr, V, stride_x,
    BLOCK: tl.constexpr, PARTS: tl.constexpr, PDL: tl.constexpr = 0,
):  # fmt: skip
    pdl_enter(PDL)  # first: with PDL, wait for the previous kernel
    row = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    parts = tl.num_programs(1)
    offs = part * BLOCK + tl.arange(0, BLOCK)
    inside = offs < V
    v = tl.load(x_ptr + row * stride_x + offs, mask=inside, other=float("-inf")).to(tl.float32)
    nan = (v != v) & inside
    first_nan = tl.min(tl.where(nan, offs, V), axis=0)
    v = tl.where(nan, float("-inf"), v)
    peak = tl.max(v, axis=0)
    first_peak = tl.min(tl.where(inside & (v == peak), offs, V), axis=0)
    has_nan = first_nan < V
    best_idx = tl.where(has_nan, first_nan, first_peak)
    best_val = tl.where(has_nan, float("nan"), peak)
    if parts == 1:
        tl.store(out_ptr + row, best_idx.to(tl.int64))
        return
    tl.store(part_val_ptr + row * parts + part, best_val)
    tl.store(part_idx_ptr + row * parts + part, best_idx)
    # The partials are stored before the ticket; its acq_rel atomic publishes them to the
    # program that draws the last one.
    tl.debug_barrier()
    ticket = tl.atomic_add(counter_ptr + row, 1, sem="acq_rel")
    if ticket == parts - 1:
        slots = tl.arange(0, PARTS)
        live = slots < parts
        vals = tl.load(part_val_ptr + row * parts + slots, mask=live, other=float("-inf"))
        idxs = tl.load(part_idx_ptr + row * parts + slots, mask=live, other=V)
        nan_parts = (vals != vals) & live
        nan_idx = tl.min(tl.where(nan_parts, idxs, V), axis=0)
        vals = tl.where(nan_parts, float("-inf"), vals)
        top = tl.max(vals, axis=0)
        top_idx = tl.min(tl.where(live & (vals == top), idxs, V), axis=0)
        winner = tl.where(nan_idx < V, nan_idx, top_idx)
        tl.store(out_ptr + row, winner.to(tl.int64))
        tl.atomic_xchg(counter_ptr + row, 0)  # zeroed for the next launch


def launch_argmax(x: torch.Tensor) -> torch.Tensor:
    """``int64 [R]``: the argmax of each row of ``x [R, V]`` (unit stride along V; arguments
    checked by ``argmax_last_dim``)."""
    R, V = x.shape
    out = torch.empty(R, dtype=torch.int64, device=x.device)
    parts = triton.cdiv(V, BLOCK)
    part_val = torch.empty(R * parts, dtype=torch.float32, device=x.device)
    part_idx = torch.empty(R * parts, dtype=torch.int32, device=x.device)
    _argmax_kernel[(R, parts)](
        x, part_val, part_idx, out, tile_counters(x.device, R), V, x.stride(0),
        BLOCK=BLOCK, PARTS=max(triton.next_power_of_2(parts), 2), num_warps=NUM_WARPS,
        **pdl_options(x.device, early_trigger=True),
    )  # fmt: skip
    return out
