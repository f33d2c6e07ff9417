"""Staged streaming: a layer's missing experts copied into device memory by a wide kernel first.

On the streamed miss path (``StreamedExperts``) the grouped FP16 kernel reads an expert that
holds no slot in place from pinned host memory, inside its own tiles: a per-pair tile of
DeepSeek-V2-Lite's gate_up gives one missing expert 22 programs, each reading 512 KB in
order, so few reads are in flight and the link runs well below what it carries (a
verification's timeline on an H200 measured about 18 GB/s, where a plain zero-copy read
reaches 41-45 GB/s). *Staging* splits the work: :func:`stage_streamed` first copies the
layer's missing routed experts, in id order, into a small device buffer
(:class:`StagingBuffer`, shared by every layer, since layers run one after another) with a
kernel of a thousand programs per expert, and returns the layer's addresses with those
experts pointing at the buffer. The grouped kernel then reads them at device speed.

Nothing is decided on the host, so a staged verification stays one CUDA graph. The staged
experts are still "streamed" (their bytes crossed PCIe, and the grouped kernel flags them
as it does any expert without a slot); missing experts past the buffer's ``num_slots`` are
read in place as before. The values are the same wherever a weight is read from, so the
bits are too.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specter_kernels.backend import select_backend
from specter_kernels.streaming.experts import StreamedExperts


@dataclass(frozen=True)
class StagingBuffer:
    """Device memory for ``num_slots`` staged experts and one layer's address tables.

    Build it with :meth:`allocate`. One buffer serves every layer of a model whose layers
    share ``(E, H, I)``: a layer's staging overwrites the previous layer's, which stream
    order has finished reading.

    Attributes:
        weights: fp16 ``[S, 3 * I * H]`` on the device: slot ``s`` holds an expert's gate_up
            ``[2I, H]`` followed by its down ``[H, I]``.
        w13_addresses: int64 ``[E]``: the last staged layer's gate_up addresses (a staged
            expert's slot in ``weights``, any other expert's streamed address).
        w2_addresses: int64 ``[E]``: the same for the down weights.
        staged_experts: int32 ``[S]``: the expert in each slot at the last staging, -1 for
            none.
        hidden_dim: ``H``.
        intermediate_dim: ``I``.
    """

    weights: torch.Tensor
    w13_addresses: torch.Tensor
    w2_addresses: torch.Tensor
    staged_experts: torch.Tensor
    hidden_dim: int
    intermediate_dim: int

    @property
    def num_slots(self) -> int:
        """``S``."""
        return self.weights.shape[0]

    @property
    def num_experts(self) -> int:
        """``E``."""
        return self.w13_addresses.numel()

    @property
    def nbytes(self) -> int:
        """Device bytes of the buffer (the weights and the small tables)."""
        tables = (self.w13_addresses, self.w2_addresses, self.staged_experts)
        return self.weights.nbytes + sum(t.nbytes for t in tables)

    @classmethod
    def allocate(
        cls,
        num_slots: int,
        num_experts: int,
        hidden_dim: int,
        intermediate_dim: int,
        device: torch.device | str,
    ) -> StagingBuffer:
        """An empty buffer of ``num_slots`` expert slots on ``device``.

        Raises:
            ValueError: ``num_slots``, ``num_experts`` or a dimension below 1.
        """
        for name, value in (
            ("num_slots", num_slots),
            ("num_experts", num_experts),
            ("hidden_dim", hidden_dim),
            ("intermediate_dim", intermediate_dim),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(
                    f"StagingBuffer needs {name} to be an int of at least 1, got {value!r}"
                    + (" (no staging: do not build a buffer)" if name == "num_slots" else "")
                )
        device = torch.device(device)
        per_expert = 3 * intermediate_dim * hidden_dim
        return cls(
            weights=torch.empty(num_slots, per_expert, dtype=torch.float16, device=device),
            w13_addresses=torch.zeros(num_experts, dtype=torch.int64, device=device),
            w2_addresses=torch.zeros(num_experts, dtype=torch.int64, device=device),
            staged_experts=torch.full((num_slots,), -1, dtype=torch.int32, device=device),
            hidden_dim=hidden_dim,
            intermediate_dim=intermediate_dim,
        )

    def slot_weights(self, slot: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of slot ``slot``: (gate_up ``[2I, H]``, down ``[H, I]``)."""
        H, I = self.hidden_dim, self.intermediate_dim
        row = self.weights[slot]
        return row[: 2 * I * H].view(2 * I, H), row[2 * I * H :].view(H, I)


def _check(
    topk_ids: torch.Tensor,
    expert_to_slot: torch.Tensor,
    expert_mask: torch.Tensor,
    streamed: StreamedExperts,
    staging: StagingBuffer,
) -> None:
    if not isinstance(streamed, StreamedExperts):
        raise TypeError(f"streamed must be a StreamedExperts, got {type(streamed).__name__}")
    if not isinstance(staging, StagingBuffer):
        raise TypeError(f"staging must be a StagingBuffer, got {type(staging).__name__}")
    if topk_ids.dim() != 2 or topk_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(
            f"topk_ids must be int32 or int64 [T, k], got {topk_ids.dtype} {tuple(topk_ids.shape)}"
        )
    E = streamed.num_experts
    device = topk_ids.device
    if expert_to_slot.dtype != torch.int32 or tuple(expert_to_slot.shape) != (E,):
        raise TypeError(
            f"expert_to_slot must be int32 [E={E}], got {expert_to_slot.dtype} "
            f"{list(expert_to_slot.shape)}"
        )
    if expert_mask.dtype != torch.bool or tuple(expert_mask.shape) != (E,):
        raise TypeError(
            f"expert_mask must be bool [E={E}], got {expert_mask.dtype} {list(expert_mask.shape)}"
        )
    two_i, h = streamed.w13[0].shape
    if (staging.num_experts, staging.hidden_dim, staging.intermediate_dim) != (E, h, two_i // 2):
        raise ValueError(
            f"the staging buffer is for E={staging.num_experts}, H={staging.hidden_dim}, "
            f"I={staging.intermediate_dim}; these streamed experts are E={E}, H={h}, "
            f"I={two_i // 2}: allocate one for this model's layers"
        )
    for name, t in (
        ("expert_to_slot", expert_to_slot),
        ("expert_mask", expert_mask),
        ("the streamed addresses", streamed.w13_addresses),
        ("the staging buffer", staging.weights),
    ):
        if t.device != device:
            raise ValueError(f"{name} is on {t.device} but topk_ids is on {device}")


def staged_view(streamed: StreamedExperts, staging: StagingBuffer) -> StreamedExperts:
    """``streamed`` with ``staging``'s address tables: what the grouped kernel reads after
    :func:`stage_streamed` (the host tensors are the same, so the torch reference reads the
    same values)."""
    return StreamedExperts(staging.w13_addresses, staging.w2_addresses, streamed.w13, streamed.w2)


def stage_streamed_reference(
    topk_ids: torch.Tensor,
    expert_to_slot: torch.Tensor,
    expert_mask: torch.Tensor,
    streamed: StreamedExperts,
    staging: StagingBuffer,
) -> StreamedExperts:
    """Plain torch reference of :func:`stage_streamed` (syncs)."""
    _check(topk_ids, expert_to_slot, expert_mask, streamed, staging)
    E = streamed.num_experts
    ids = topk_ids.reshape(-1).long()
    routed = torch.zeros(E, dtype=torch.bool, device=ids.device)
    routed[ids[(ids >= 0) & (ids < E)]] = True
    missing = routed & expert_mask & (expert_to_slot < 0)
    staged = torch.nonzero(missing).flatten()[: staging.num_slots].tolist()
    w13_addresses = streamed.w13_addresses.clone()
    w2_addresses = streamed.w2_addresses.clone()
    staging.staged_experts.fill_(-1)
    for slot, expert in enumerate(staged):
        gate_up, down = staging.slot_weights(slot)
        gate_up.copy_(streamed.w13[expert])
        down.copy_(streamed.w2[expert])
        w13_addresses[expert] = gate_up.data_ptr()
        w2_addresses[expert] = down.data_ptr()
        staging.staged_experts[slot] = expert
    staging.w13_addresses.copy_(w13_addresses)
    staging.w2_addresses.copy_(w2_addresses)
    return staged_view(streamed, staging)


def stage_streamed(
    topk_ids: torch.Tensor,
    expert_to_slot: torch.Tensor,
    expert_mask: torch.Tensor,
    streamed: StreamedExperts,
    staging: StagingBuffer,
) -> StreamedExperts:
    """Copy a layer's missing routed experts into ``staging``; their addresses, for the
    grouped kernel.

    The experts routed to by ``topk_ids`` that are in ``expert_mask`` and hold no slot
    (``expert_to_slot`` -1) are the missing ones. The first ``staging.num_slots`` of them in
    id order are copied from ``streamed`` into the buffer's slots, in that order
    (``staging.staged_experts`` records which). The returned ``StreamedExperts`` has
    ``staging``'s address tables: a staged expert's entries point at its slot, every other
    entry is ``streamed``'s. Pass it to :func:`grouped_moe_fp16` as ``streamed`` with the
    same ``expert_to_slot``: the staged experts are read from device memory, the others as
    before, and every missing one is still flagged. No host sync (on CUDA two launches: a
    one-program plan, then the copy).

    Args:
        topk_ids: int ``[T, k]`` routed experts; ids outside ``[0, E)`` route nowhere.
        expert_to_slot: int32 ``[E]``: the device map the grouped kernel will read.
        expert_mask: bool ``[E]``: the experts the grouped kernel will compute.
        streamed: this layer's ``StreamedExperts``.
        staging: the buffer (``StagingBuffer.allocate`` for this model's ``E, H, I``).

    Returns:
        ``StreamedExperts`` over ``staging``'s tables (valid until the next staging).

    Raises:
        TypeError, ValueError: bad dtypes, shapes or devices, or a buffer for other
            dimensions.
    """
    _check(topk_ids, expert_to_slot, expert_mask, streamed, staging)
    if select_backend(topk_ids.device) == "torch":
        return stage_streamed_reference(topk_ids, expert_to_slot, expert_mask, streamed, staging)
    from specter_kernels.streaming.staging_triton import launch_stage_streamed

    launch_stage_streamed(
        topk_ids.contiguous().view(-1), expert_to_slot, expert_mask.view(torch.uint8), streamed,
        staging,
    )  # fmt: skip
    return staged_view(streamed, staging)
