"""Streamed fills: a streamed expert is also written into a spare slot, for no extra transfer.

On the streamed miss path (``StreamedExperts``) a verification reads an expert that holds
no cache slot in place from pinned host memory. Its bytes cross PCIe once, and are gone:
when the next verification routes to that expert again, they cross again. A *fill* keeps
them. The cache offers the verification candidate slots per layer, coldest first: empty
ones and ones whose expert it may evict. :func:`assign_fill_slots` gives each missing
routed expert, in id order, the next candidate whose expert this layer does not route to
(a slot the verification reads must not change under it), and takes the evicted experts
off the device map. The grouped FP16 kernel (``grouped_moe_fp16(fill_slots=)``) then
stores every weight tile it streams for such an expert into its slot as it goes. The HBM
writes cost nothing next to the PCIe reads, and after the forward the expert is resident,
as if it had been loaded, while an expert is evicted only for a miss that replaces it.

Nothing here needs the host, so it stays inside the verification's CUDA graph: the
candidates are device tensors the host rewrites between forwards, and the assignment
depends only on the routed ids and those tensors.
"""

from __future__ import annotations

import torch

from specter_kernels.backend import select_backend


def _check(
    topk_ids: torch.Tensor,
    claimed: torch.Tensor,
    spare_slots: torch.Tensor,
    spare_experts: torch.Tensor,
    expert_to_slot: torch.Tensor,
) -> None:
    if topk_ids.dim() != 2 or topk_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(
            f"topk_ids must be int32 or int64 [T, k], got {topk_ids.dtype} {tuple(topk_ids.shape)}"
        )
    tensors = {
        "claimed": claimed,
        "spare_slots": spare_slots,
        "spare_experts": spare_experts,
        "expert_to_slot": expert_to_slot,
    }
    for name, t in tensors.items():
        if t.dim() != 1 or t.dtype != torch.int32 or not t.is_contiguous():
            raise TypeError(
                f"{name} must be a contiguous int32 vector, got {t.dtype} {tuple(t.shape)}"
            )
        if t.device != topk_ids.device:
            raise ValueError(f"{name} is on {t.device} but topk_ids is on {topk_ids.device}")
    if claimed.numel() == 0 or expert_to_slot.numel() != claimed.numel():
        raise ValueError(
            f"claimed and expert_to_slot need one entry per expert each, got "
            f"{claimed.numel()} and {expert_to_slot.numel()}"
        )
    if spare_experts.numel() != spare_slots.numel():
        raise ValueError(
            f"spare_experts needs one entry per spare slot ({spare_slots.numel()}), got "
            f"{spare_experts.numel()}"
        )


def check_fill_vector(t: torch.Tensor, name: str, num_experts: int, device: torch.device) -> None:
    """``TypeError`` naming ``name`` unless ``t`` is a contiguous int32 ``[E]`` on ``device``
    (a fill-slot vector: ``assign_fill_slots``' output, ``grouped_moe_fp16``'s input)."""
    if (
        t.dtype != torch.int32
        or tuple(t.shape) != (num_experts,)
        or not t.is_contiguous()
        or t.device != device
    ):
        raise TypeError(
            f"{name} must be a contiguous int32 [E={num_experts}] tensor on {device}, got "
            f"{t.dtype} {list(t.shape)} on {t.device}"
        )


def assign_fill_slots_reference(
    topk_ids: torch.Tensor,
    claimed: torch.Tensor,
    spare_slots: torch.Tensor,
    spare_experts: torch.Tensor,
    expert_to_slot: torch.Tensor,
) -> torch.Tensor:
    """Plain torch reference of :func:`assign_fill_slots` (returns a new ``[E]`` tensor and
    updates ``expert_to_slot`` in place)."""
    _check(topk_ids, claimed, spare_slots, spare_experts, expert_to_slot)
    E = claimed.numel()
    ids = topk_ids.reshape(-1).long()
    routed = torch.zeros(E, dtype=torch.bool, device=ids.device)
    routed[ids[(ids >= 0) & (ids < E)]] = True
    missing = routed & (claimed < 0)
    holder = spare_experts.long()
    held_routed = routed[holder.clamp(0, E - 1)] & (holder >= 0)
    usable = (spare_slots >= 0) & ~held_routed
    slots, experts = spare_slots[usable], holder[usable]
    rank = torch.cumsum(missing.int(), 0) - 1
    take = missing & (rank < slots.numel())
    fill = torch.full((E,), -1, dtype=torch.int32, device=ids.device)
    fill[take] = slots[rank[take]]
    evicted = experts[: int(take.sum())]
    expert_to_slot[evicted[evicted >= 0]] = -1
    return fill


def assign_fill_slots(
    topk_ids: torch.Tensor,
    claimed: torch.Tensor,
    spare_slots: torch.Tensor,
    spare_experts: torch.Tensor,
    expert_to_slot: torch.Tensor,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The slot each missing routed expert is filled into, on the device.

    The experts routed to by ``topk_ids`` that hold no slot (``claimed`` -1), in id order,
    take the *usable* candidates in order: the r-th missing expert gets the r-th candidate
    slot that is valid and whose expert (``spare_experts``) is not routed to here. Missing
    experts past the last usable candidate, and every other expert, get -1. The expert of
    each candidate taken is evicted: its ``expert_to_slot`` entry becomes -1 (no other
    entry is written). One program, no host sync (on CUDA one launch).

    Args:
        topk_ids: int ``[T, k]`` routed experts; ids outside ``[0, E)`` (padding pairs,
            -1) route nowhere.
        claimed: int32 ``[E]``: the slot the host holds for each expert (loads in flight
            included), -1 for none: only those may be filled.
        spare_slots: int32 ``[F]``: candidate slots, the first to take first, -1 after the
            last.
        spare_experts: int32 ``[F]``: the expert each candidate holds (-1: empty).
        expert_to_slot: int32 ``[E]``: the device map the kernel reads; evicted experts'
            entries are set to -1.
        out: int32 ``[E]`` to write into (a graph's static buffer); None: a new tensor.

    Returns:
        int32 ``[E]``: ``fill_slots`` for :func:`grouped_moe_fp16`.

    Raises:
        TypeError, ValueError: bad dtypes, shapes or devices.

    Example:
        >>> import torch, specter_kernels as sk
        >>> ids = torch.tensor([[3, 1], [5, 2]])
        >>> claimed = torch.tensor([0, -1, 1, -1, 2, -1], dtype=torch.int32)  # 1, 3, 5 missing
        >>> device_map = claimed.clone()
        >>> slots = torch.tensor([1, 2, 5], dtype=torch.int32)  # coldest first
        >>> holders = torch.tensor([2, 4, -1], dtype=torch.int32)  # expert 2 is routed: kept
        >>> sk.assign_fill_slots(ids, claimed, slots, holders, device_map).tolist()
        [-1, 2, -1, 5, -1, -1]
        >>> device_map.tolist()  # expert 4 evicted for expert 1
        [0, -1, 1, -1, -1, -1]
    """
    _check(topk_ids, claimed, spare_slots, spare_experts, expert_to_slot)
    E = claimed.numel()
    if out is not None:
        check_fill_vector(out, "out", E, topk_ids.device)
    if select_backend(topk_ids.device) == "torch" or spare_slots.numel() == 0:
        fill = assign_fill_slots_reference(
            topk_ids, claimed, spare_slots, spare_experts, expert_to_slot
        )
        return fill if out is None else out.copy_(fill)
    from specter_kernels.streaming.fills_triton import launch_assign_fill_slots

    if out is None:
        out = torch.empty(E, dtype=torch.int32, device=topk_ids.device)
    ids = topk_ids.contiguous().view(-1)
    return launch_assign_fill_slots(ids, claimed, spare_slots, spare_experts, expert_to_slot, out)
