"""Triton kernel of ``assign_fill_slots``: one program ranks the missing routed experts onto
the usable candidate slots and evicts the candidates' experts from the map."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

PAIRS_PER_STEP = 64


@triton.jit
def routed_experts(ids_ptr, num_pairs, BLOCK_E: tl.constexpr, BLOCK_P: tl.constexpr):
    """int32 ``[BLOCK_E]``: 1 where expert ``e`` is routed to by one of the ``num_pairs`` flat
    ids at ``ids_ptr`` (ids outside ``[0, E)`` match no expert), 0 elsewhere."""
    experts = tl.arange(0, BLOCK_E)
    routed = tl.zeros([BLOCK_E], dtype=tl.int32)
    for p0 in range(0, num_pairs, BLOCK_P):
        pairs = p0 + tl.arange(0, BLOCK_P)
        ids = tl.load(ids_ptr + pairs, mask=pairs < num_pairs, other=-1).to(tl.int32)
        hit = (ids[None, :] == experts[:, None]).to(tl.int32)
        routed = tl.maximum(routed, tl.max(hit, axis=1))
    return routed


@triton.jit
def _assign_fill_slots_kernel(
    ids_ptr,
    claimed_ptr,
    spare_slots_ptr,
    spare_experts_ptr,
    map_ptr,
    fill_ptr,
    num_pairs,
    num_experts,
    num_spares,
    BLOCK_E: tl.constexpr,
    BLOCK_F: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    experts = tl.arange(0, BLOCK_E)
    in_range = experts < num_experts
    routed = routed_experts(ids_ptr, num_pairs, BLOCK_E, BLOCK_P)
    claimed = tl.load(claimed_ptr + experts, mask=in_range, other=0)
    missing = (routed > 0) & (claimed < 0) & in_range
    rank = tl.cumsum(missing.to(tl.int32), axis=0) - 1  # [E]: order among the missing
    # Candidates: valid, and holding no expert this layer routes to.
    spares = tl.arange(0, BLOCK_F)
    in_list = spares < num_spares
    slot = tl.load(spare_slots_ptr + spares, mask=in_list, other=-1)
    holder = tl.load(spare_experts_ptr + spares, mask=in_list, other=-1)
    holder_routed = tl.sum(
        ((holder[:, None] == experts[None, :]) & (routed[None, :] > 0)).to(tl.int32), axis=1
    )
    usable = (slot >= 0) & (holder_routed == 0)
    usable_rank = tl.cumsum(usable.to(tl.int32), axis=0) - 1  # [F]
    # Missing expert of rank r takes the usable candidate of rank r.
    match = missing[:, None] & usable[None, :] & (rank[:, None] == usable_rank[None, :])
    fill = tl.sum(tl.where(match, slot[None, :] + 1, 0), axis=1) - 1  # -1 without a match
    tl.store(fill_ptr + experts, fill, mask=in_range)
    taken = usable & (usable_rank < tl.sum(missing.to(tl.int32), axis=0)) & (holder >= 0)
    tl.store(map_ptr + tl.where(taken, holder, 0), -1, mask=taken)


def launch_assign_fill_slots(
    ids: torch.Tensor,
    claimed: torch.Tensor,
    spare_slots: torch.Tensor,
    spare_experts: torch.Tensor,
    expert_to_slot: torch.Tensor,
    out: torch.Tensor,
) -> torch.Tensor:
    """``ids`` flat ``[T*k]``; arguments validated by the caller."""
    E, F = claimed.numel(), spare_slots.numel()
    _assign_fill_slots_kernel[(1,)](
        ids, claimed, spare_slots, spare_experts, expert_to_slot, out, ids.numel(), E, F,
        BLOCK_E=triton.next_power_of_2(E), BLOCK_F=triton.next_power_of_2(F),
        BLOCK_P=PAIRS_PER_STEP, num_warps=4,
    )  # fmt: skip
    return out
