"""Streamed fills: a streamed expert is also written into a spare slot, for no extra transfer.

On the streamed miss path (``StreamedExperts``) a verification reads an expert that holds
no cache slot in place from pinned host memory. Its bytes cross PCIe once, and are gone:
when the next verification routes to that expert again, they cross again. A *fill* keeps
them. The cache hands the verification a few spare slots per layer (slots that hold no
expert, so nothing reads them), :func:`assign_fill_slots` gives each missing routed expert
one of them on the device, and the grouped FP16 kernel (``grouped_moe_fp16(fill_slots=)``)
stores every weight tile it streams for that expert into its spare slot as it goes. The
HBM writes cost nothing next to the PCIe reads, and after the forward the expert is
resident, as if it had been loaded.

Nothing here needs the host, so it stays inside the verification's CUDA graph: the spares
are a device tensor the host rewrites between forwards, and the assignment depends only on
the routed ids and the slot map, both on the device.
"""

from __future__ import annotations

import torch

from specter_kernels.backend import select_backend


def _check(topk_ids: torch.Tensor, expert_to_slot: torch.Tensor, spares: torch.Tensor) -> None:
    if topk_ids.dim() != 2 or topk_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(
            f"topk_ids must be int32 or int64 [T, k], got {topk_ids.dtype} {tuple(topk_ids.shape)}"
        )
    for name, t in (("expert_to_slot", expert_to_slot), ("spares", spares)):
        if t.dim() != 1 or t.dtype != torch.int32 or not t.is_contiguous():
            raise TypeError(
                f"{name} must be a contiguous int32 vector, got {t.dtype} {tuple(t.shape)}"
            )
        if t.device != topk_ids.device:
            raise ValueError(f"{name} is on {t.device} but topk_ids is on {topk_ids.device}")
    if expert_to_slot.numel() == 0:
        raise ValueError("expert_to_slot must have one entry per expert, got none")


def assign_fill_slots_reference(
    topk_ids: torch.Tensor, expert_to_slot: torch.Tensor, spares: torch.Tensor
) -> torch.Tensor:
    """Plain torch reference of :func:`assign_fill_slots`."""
    _check(topk_ids, expert_to_slot, spares)
    E = expert_to_slot.numel()
    ids = topk_ids.reshape(-1).long()
    routed = torch.zeros(E, dtype=torch.bool, device=ids.device)
    routed[ids[(ids >= 0) & (ids < E)]] = True
    missing = routed & (expert_to_slot < 0)
    rank = torch.cumsum(missing.int(), 0) - 1
    take = missing & (rank < spares.numel())
    fill = torch.full((E,), -1, dtype=torch.int32, device=ids.device)
    fill[take] = spares[rank[take]]
    return fill


def assign_fill_slots(
    topk_ids: torch.Tensor,
    expert_to_slot: torch.Tensor,
    spares: torch.Tensor,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The spare slot each missing routed expert is filled into, on the device.

    The experts routed to by ``topk_ids`` that hold no slot (``expert_to_slot`` -1), in id
    order, take the spares in order: the r-th missing one gets ``spares[r]``. Missing
    experts past the last spare, and every other expert, get -1. One program, no host sync
    (on CUDA one launch).

    Args:
        topk_ids: int ``[T, k]`` routed experts; ids outside ``[0, E)`` (padding pairs,
            -1) route nowhere.
        expert_to_slot: int32 ``[E]``: the slot of each expert, -1 for none.
        spares: int32 ``[F]``: spare slots (holding no expert), valid ones first, then -1
            (an expert ranked at a -1 entry is not filled).
        out: int32 ``[E]`` to write into (a graph's static buffer); None: a new tensor.

    Returns:
        int32 ``[E]``: ``fill_slots`` for :func:`grouped_moe_fp16`.

    Raises:
        TypeError, ValueError: bad dtypes, shapes or devices.

    Example:
        >>> import torch, specter_kernels as sk
        >>> ids = torch.tensor([[3, 1], [5, 1]])
        >>> slot_of = torch.tensor([0, -1, 1, -1, 2, -1], dtype=torch.int32)  # 1, 3, 5 missing
        >>> sk.assign_fill_slots(ids, slot_of, torch.tensor([7, 6], dtype=torch.int32)).tolist()
        [-1, 7, -1, 6, -1, -1]
    """
    _check(topk_ids, expert_to_slot, spares)
    E = expert_to_slot.numel()
    if out is not None and (
        out.dtype != torch.int32
        or tuple(out.shape) != (E,)
        or not out.is_contiguous()
        or out.device != topk_ids.device
    ):
        raise TypeError(
            f"out must be a contiguous int32 [E={E}] tensor on {topk_ids.device}, got "
            f"{out.dtype} {tuple(out.shape)} on {out.device}"
        )
    if select_backend(topk_ids.device) == "torch" or spares.numel() == 0:
        fill = assign_fill_slots_reference(topk_ids, expert_to_slot, spares)
        if out is None:
            return fill
        return out.copy_(fill)
    from specter_kernels.streamed_fills_triton import launch_assign_fill_slots

    if out is None:
        out = torch.empty(E, dtype=torch.int32, device=topk_ids.device)
    return launch_assign_fill_slots(topk_ids.contiguous().view(-1), expert_to_slot, spares, out)
