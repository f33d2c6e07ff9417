"""Target and draft views of a loaded model over its KV slots: specter-spec's batched models.

``BatchedTarget`` and ``BatchedDraft`` follow specter-spec's ``BatchSpecModel``: slot ``s``
holds one sequence, with the single-sequence adapters' contract per slot (the target owns
the committed prefix, the draft reads it and appends scratch after it; ``spec_adapters``).
A ``forward_batch`` runs every sequence's rows as one packed forward (``batch_forward``):
row-wise work over all rows, the routed experts of each layer over the union of the
sequences' experts, attention per sequence on its slot.

Each sequence computes what it would compute alone:

* its **prefill** is the single-sequence adapter's, on its slot (``TargetModel.prefill``
  with the role's step-graph choices run eagerly there, ``StepGraphs.for_cache``), so its
  KV holds the bits a single-sequence prefill writes;
* in a **decode step** its attention reads the window a forward of its rows alone would
  read (the role's step graphs' window where window mode applies to them, else exactly its
  filled positions), and every other part of the forward is row-wise; with batch-invariant
  kernels (``KernelConfig.batch_invariant``, on for half precision on CUDA) its logits are
  then the bits it gets alone, whatever the other sequences and their lengths.

``BatchedSlots`` holds what both share: the slots' committed lengths, the packed forward
and its working-set counts (``working_set``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from specter_kernels import argmax_last_dim
from specter_models.batch_forward import PackedForward, SlotSegment
from specter_models.experts_runtime import ExpertsMode
from specter_models.kv_cache import KVCacheFullError
from specter_models.spec_adapters import DraftModel, SharedKV, TargetModel
from specter_models.working_set import WorkingSet
from specter_spec import SlotRows

__all__ = ["BatchedDraft", "BatchedSlots", "BatchedTarget"]


class BatchedSlots:
    """The KV slots of a loaded model set up for batched decoding.

    Args:
        loaded: a ``SpecterModel`` (``kv_slots`` holds its slots; slot 0 is ``loaded.kv``).

    Attributes:
        kv: per slot, its committed length and cache (``SharedKV``).
        working_set: distinct experts per layer of each packed forward.

    Raises:
        ValueError: a model without KV slots, or with a CPU expert executor or a routing
            replay (their per-forward host work is per sequence: not batched).
    """

    def __init__(self, loaded: Any):
        slots = loaded.kv_slots
        if slots is None:
            raise ValueError("this model has no KV slots; load it with specter_models.load")
        runtime = loaded.runtime
        if runtime.cpu_experts is not None:
            raise ValueError(
                "batched decoding does not run CPU-homed experts (CpuExpertsConfig.mode "
                "'on' or 'auto' homed some): decode one sequence at a time, or turn the CPU "
                "expert path off"
            )
        if runtime.routing_replay is not None:
            raise ValueError("batched decoding does not replay a routing trace: decode alone")
        self.loaded = loaded
        self.num_slots = slots.num_slots
        self.max_seq_len = slots.max_seq_len
        self.kv = [
            loaded.kv if s == 0 else SharedKV(slots.cache(s)) for s in range(slots.num_slots)
        ]
        cache = loaded.cache
        self.working_set = WorkingSet(cache.num_layers, cache.num_experts, loaded.device)
        self.packed = PackedForward(
            loaded.model, runtime, slots.max_seq_len, working_set=self.working_set,
            graphs=loaded.cuda_graphs,
        )  # fmt: skip
        self._singles: dict[tuple[str, int], TargetModel | DraftModel] = {}

    def single(self, role: str, slot: int) -> TargetModel | DraftModel:
        """Slot ``slot``'s single-sequence adapter of ``role`` (``"target"`` or ``"draft"``),
        with the role's step-graph choices run eagerly on the slot."""
        key = (role, slot)
        adapter = self._singles.get(key)
        if adapter is None:
            loaded = self.loaded
            kind, solo = (TargetModel, loaded.target) if role == "target" else (
                DraftModel, loaded.draft)  # fmt: skip
            adapter = kind(loaded.model, loaded.runtime, self.kv[slot])
            if solo.graphs is not None:
                adapter.graphs = solo.graphs.for_cache(self.kv[slot].cache)
            self._singles[key] = adapter
        return adapter

    def window(self, role: str, rows: int, start: int) -> int:
        """The key rows a forward of ``rows`` rows at ``start`` of this role alone reads."""
        graphs = self._solo_graphs(role)
        if graphs is not None and graphs.applies(rows):
            return graphs.window_for(start + graphs.padded_rows(rows, start))
        return start + rows

    def graphable(self, rows: Sequence[SlotRows], role: str) -> bool:
        """Whether every sequence's window comes in buckets (its forward alone is a window
        step), so the packed forward's shape repeats and may be captured
        (``batch_graphs``)."""
        graphs = self._solo_graphs(role)
        return graphs is not None and all(graphs.applies(r.input_ids.shape[0]) for r in rows)

    def _solo_graphs(self, role: str) -> Any:
        solo = self.loaded.target if role == "target" else self.loaded.draft
        return solo.graphs

    def check_rows(self, rows: Sequence[SlotRows], role: str) -> None:
        """Raise a clear error for rows a packed forward cannot take."""
        if not rows:
            raise ValueError(f"the batched {role} needs at least one sequence's rows")
        seen = set()
        for r in rows:
            if isinstance(r.slot, bool) or not isinstance(r.slot, int):
                raise TypeError(f"a slot must be an int, got {r.slot!r}")
            if not 0 <= r.slot < self.num_slots or r.slot in seen:
                raise ValueError(
                    f"slot {r.slot} is not one of the {self.num_slots} slots or appears twice"
                )
            seen.add(r.slot)
            ids = r.input_ids
            if not isinstance(ids, torch.Tensor) or ids.dim() != 1 or ids.shape[0] < 1:
                raise ValueError(
                    f"slot {r.slot}'s input_ids must be a [T] tensor with T >= 1, got "
                    f"{getattr(ids, 'shape', type(ids))}"
                )
            if ids.dtype.is_floating_point:
                raise TypeError(f"slot {r.slot}'s input_ids are {ids.dtype}, not token ids")
            end = r.start + ids.shape[0]
            if end > self.max_seq_len:
                raise KVCacheFullError(
                    f"slot {r.slot}: positions up to {end - 1} do not fit max_seq_len="
                    f"{self.max_seq_len}; load the model with a larger max_seq_len"
                )

    def segments(self, rows: Sequence[SlotRows], role: str) -> list[SlotSegment]:
        device = self.loaded.device
        return [
            SlotSegment(
                self.kv[r.slot].cache,
                r.input_ids.to(device=device, dtype=torch.long),
                r.start,
                self.window(role, r.input_ids.shape[0], r.start),
            )
            for r in rows
        ]


class _Batched:
    role = "model"

    def __init__(self, slots: BatchedSlots):
        self.slots = slots
        self.num_slots = slots.num_slots

    @property
    def device(self) -> torch.device:
        """Where input ids must live."""
        return self.slots.loaded.device

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        """specter-kernels' ``argmax_last_dim`` (``torch.argmax``'s result)."""
        return argmax_last_dim(logits)

    def prefill(self, slot: int, input_ids: torch.Tensor, start_pos: int) -> None:
        """Slot ``slot``'s prompt, through the single-sequence adapter (see the module
        docstring)."""
        self.slots.single(self.role, slot).prefill(input_ids, start_pos)

    def truncate(self, slot: int, length: int) -> None:
        """Slot ``slot``'s single-sequence ``truncate``."""
        self.slots.single(self.role, slot).truncate(length)


class BatchedTarget(_Batched):
    """The FP16 target over the KV slots: a slot's ``kv_length`` is its committed length."""

    role = "target"

    def kv_length(self, slot: int) -> int:
        return self.slots.kv[slot].committed

    def forward_batch(self, rows: Sequence[SlotRows]) -> torch.Tensor:
        """Verify each sequence's rows at its committed length (its draft scratch is
        dropped first); returns ``[N, V]`` logits.

        Raises:
            ValueError: bad rows, or a start other than the slot's committed length.
        """
        slots = self.slots
        slots.check_rows(rows, self.role)
        for r in rows:
            kv = slots.kv[r.slot]
            if r.start != kv.committed:
                raise ValueError(
                    f"slot {r.slot}: target start={r.start} but its committed KV holds "
                    f"{kv.committed} positions; call truncate(slot, start) to roll back"
                )
            kv.cache.crop_to(r.start)  # the draft's scratch
        segments = slots.segments(rows, self.role)
        logits = slots.packed(ExpertsMode.TARGET, segments, slots.graphable(rows, self.role))
        for r in rows:
            slots.kv[r.slot].committed = r.start + r.input_ids.shape[0]
        return logits


class BatchedDraft(_Batched):
    """The INT4 draft over the KV slots: a slot's ``kv_length`` is committed plus scratch."""

    role = "draft"

    def kv_length(self, slot: int) -> int:
        return self.slots.kv[slot].cache.length

    def forward_batch(self, rows: Sequence[SlotRows]) -> torch.Tensor:
        """Draft each sequence's rows after its committed prefix; returns ``[N, V]``.

        Raises:
            ValueError: bad rows, or a start inside a slot's committed prefix or past its
                length.
        """
        slots = self.slots
        slots.check_rows(rows, self.role)
        for r in rows:
            kv = slots.kv[r.slot]
            if not kv.committed <= r.start <= kv.cache.length:
                raise ValueError(
                    f"slot {r.slot}: draft start={r.start} must lie between the committed "
                    f"length {kv.committed} and kv_length {kv.cache.length}"
                )
            kv.cache.crop_to(r.start)
        segments = slots.segments(rows, self.role)
        return slots.packed(ExpertsMode.DRAFT, segments, slots.graphable(rows, self.role))
