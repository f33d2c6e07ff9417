"""Triton kernel of ``assign_fill_slots``: one program ranks the missing routed experts."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

PAIRS_PER_STEP = 64


@triton.jit
def _assign_fill_slots_kernel(
    ids_ptr,
    map_ptr,
    spares_ptr,
    fill_ptr,
    num_pairs,
    num_experts,
    num_spares,
    BLOCK_E: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    experts = tl.arange(0, BLOCK_E)
    in_range = experts < num_experts
    routed = tl.zeros([BLOCK_E], dtype=tl.int32)
    for p0 in range(0, num_pairs, BLOCK_P):
        pairs = p0 + tl.arange(0, BLOCK_P)
        ids = tl.load(ids_ptr + pairs, mask=pairs < num_pairs, other=-1).to(tl.int32)
        hit = (ids[None, :] == experts[:, None]).to(tl.int32)
        routed = tl.maximum(routed, tl.max(hit, axis=1))
    slot = tl.load(map_ptr + experts, mask=in_range, other=0)
    missing = (routed > 0) & (slot < 0) & in_range
    rank = tl.cumsum(missing.to(tl.int32), axis=0) - 1
    take = missing & (rank < num_spares)
    spare = tl.load(spares_ptr + tl.where(take, rank, 0), mask=take, other=-1)
    tl.store(fill_ptr + experts, tl.where(take, spare, -1), mask=in_range)


def launch_assign_fill_slots(
    ids: torch.Tensor, expert_to_slot: torch.Tensor, spares: torch.Tensor, out: torch.Tensor
) -> torch.Tensor:
    """``ids`` flat ``[T*k]``; arguments validated by the caller."""
    E = expert_to_slot.numel()
    _assign_fill_slots_kernel[(1,)](
        ids, expert_to_slot, spares, out, ids.numel(), E, spares.numel(),
        BLOCK_E=triton.next_power_of_2(E), BLOCK_P=PAIRS_PER_STEP, num_warps=4,
    )  # fmt: skip
    return out
