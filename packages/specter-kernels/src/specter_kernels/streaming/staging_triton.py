"""Triton kernels of ``stage_streamed``: a one-program plan (which missing experts go to which
staging slot, and the layer's address tables), then a wide copy from pinned host memory."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specter_kernels.streaming.experts import StreamedExperts
from specter_kernels.streaming.fills_triton import PAIRS_PER_STEP, routed_experts

COPY_BLOCK = 1024
"""Elements one copy program moves per step."""
COPY_STEPS = 8
"""Steps per copy program: 16 KB per program, about a thousand programs per
DeepSeek-V2-Lite expert, the shape at which a kernel reading pinned memory in place ran at
41-45 GB/s on one H200."""


@triton.jit
def _stage_plan_kernel(
    ids_ptr,
    map_ptr,
    mask_ptr,
    src13_ptr,
    src2_ptr,
    dst13_ptr,
    dst2_ptr,
    staged_ptr,
    num_pairs,
    num_experts,
    num_slots,
    stage_base,
    slot_bytes,
    down_offset_bytes,
    BLOCK_E: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    experts = tl.arange(0, BLOCK_E)
    in_range = experts < num_experts
    routed = routed_experts(ids_ptr, num_pairs, BLOCK_E, BLOCK_P)
    slot = tl.load(map_ptr + experts, mask=in_range, other=0)
    wanted = tl.load(mask_ptr + experts, mask=in_range, other=0) != 0
    missing = (routed > 0) & wanted & (slot < 0) & in_range
    rank = tl.cumsum(missing.to(tl.int32), axis=0) - 1  # [E]: order among the missing
    staged = missing & (rank < num_slots)
    base = stage_base + rank.to(tl.int64) * slot_bytes
    src13 = tl.load(src13_ptr + experts, mask=in_range, other=0)
    src2 = tl.load(src2_ptr + experts, mask=in_range, other=0)
    tl.store(dst13_ptr + experts, tl.where(staged, base, src13), mask=in_range)
    tl.store(dst2_ptr + experts, tl.where(staged, base + down_offset_bytes, src2), mask=in_range)
    # Slot s holds the missing expert of rank s (-1 when fewer are missing).
    slots = tl.arange(0, BLOCK_S)
    match = staged[None, :] & (rank[None, :] == slots[:, None])
    holder = tl.sum(tl.where(match, experts[None, :] + 1, 0), axis=1) - 1
    tl.store(staged_ptr + slots, holder, mask=slots < num_slots)


@triton.jit
def _stage_copy_kernel(
    staged_ptr,
    src13_ptr,
    src2_ptr,
    stage_ptr,
    n13,
    n_total,
    BLOCK: tl.constexpr,
    STEPS: tl.constexpr,
):
    chunk = tl.program_id(0)
    slot = tl.program_id(1)
    expert = tl.load(staged_ptr + slot)
    if expert < 0:
        return  # fewer missing experts than slots
    gate_up = tl.load(src13_ptr + expert).to(tl.pointer_type(tl.float16))
    down = tl.load(src2_ptr + expert).to(tl.pointer_type(tl.float16))
    dst = stage_ptr + slot.to(tl.int64) * n_total
    start = chunk * BLOCK * STEPS
    for step in range(STEPS):
        offs = start + step * BLOCK + tl.arange(0, BLOCK)
        upper = offs >= n13
        first = tl.load(gate_up + offs, mask=~upper, other=0.0)
        second = tl.load(down + (offs - n13), mask=upper & (offs < n_total), other=0.0)
        tl.store(dst + offs, tl.where(upper, second, first), mask=offs < n_total)


def launch_stage_streamed(
    ids: torch.Tensor,
    expert_to_slot: torch.Tensor,
    mask: torch.Tensor,
    streamed: StreamedExperts,
    staging,
) -> None:
    """``ids`` flat ``[T*k]``, ``mask`` uint8 ``[E]``; arguments validated by the caller."""
    E, S = streamed.num_experts, staging.num_slots
    n_total = staging.weights.shape[1]
    n13 = 2 * staging.intermediate_dim * staging.hidden_dim
    itemsize = staging.weights.element_size()
    _stage_plan_kernel[(1,)](
        ids, expert_to_slot, mask, streamed.w13_addresses, streamed.w2_addresses,
        staging.w13_addresses, staging.w2_addresses, staging.staged_experts,
        ids.numel(), E, S, staging.weights.data_ptr(), n_total * itemsize, n13 * itemsize,
        BLOCK_E=triton.next_power_of_2(E), BLOCK_S=max(2, triton.next_power_of_2(S)),
        BLOCK_P=PAIRS_PER_STEP, num_warps=4,
    )  # fmt: skip
    chunks = triton.cdiv(n_total, COPY_BLOCK * COPY_STEPS)
    _stage_copy_kernel[(chunks, S)](
        staging.staged_experts, streamed.w13_addresses, streamed.w2_addresses, staging.weights,
        n13, n_total, BLOCK=COPY_BLOCK, STEPS=COPY_STEPS, num_warps=4,
    )  # fmt: skip
