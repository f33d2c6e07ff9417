"""The slots of one layer: device tensors and the host bookkeeping that mirrors them.

A layer owns ``S`` slots. For every expert tensor name there is one device tensor shaped
``[S, *shape]`` (e.g. ``gate_up [S, 2I, H]``), and a device ``int32`` map ``expert_to_slot``
``[E]`` (``-1`` for experts that are not resident) that a grouped kernel can read. The host
keeps, per slot, the expert it holds, the readiness event of its last load, the last-use
event of its last reader and how many claims protect it from eviction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from specter_cache.copy_engine import TransferEvent
from specter_cache.expert_store import ExpertStore


class SlotInfo(NamedTuple):
    """Host view of one slot.

    Attributes:
        expert: the expert held (or being loaded), ``-1`` for an empty slot.
        ready: whether its load has completed (as far as the host can tell without blocking).
        protected: how many queued or in-use claims protect it from eviction.
    """

    expert: int
    ready: bool
    protected: int


class LayerPool:
    """Slots of one layer: device tensors plus the host bookkeeping that mirrors them.

    Args:
        store: the host store (gives the layer's layout and ``E``).
        layer: the layer.
        slots: its slot count ``S``.
        device: device of the slot tensors.
        expert_to_slot: the layer's ``[E]`` int32 device map (a row of the cache's maps).
    """

    def __init__(
        self,
        store: ExpertStore,
        layer: int,
        slots: int,
        device: torch.device,
        expert_to_slot: torch.Tensor,
    ):
        layout = store.layout(layer)
        self.num_slots = slots
        self.names = layout.names
        self.tensors = {
            name: torch.empty((slots, *spec.shape), dtype=spec.dtype, device=device)
            for name, spec in layout.specs.items()
        }
        # Per-slot views, made once: the load path stays free of view construction.
        self.slot_views = [[self.tensors[n][s] for n in self.names] for s in range(slots)]
        self.expert_to_slot = expert_to_slot
        self.map_views = [self.expert_to_slot[e : e + 1] for e in range(store.num_experts)]
        self.slot_expert = [-1] * slots
        self.expert_slot: dict[int, int] = {}
        self.ready: list[TransferEvent | None] = [None] * slots
        self.load_seq = [0] * slots  # issue order of the slot's last load (copy-stream FIFO)
        self.last_use: list[TransferEvent | None] = [None] * slots
        self.protect = [0] * slots
        self.empty = list(range(slots - 1, -1, -1))  # pop() hands out slot 0 first
        self.prefetched: set[int] = set()  # loaded by prefetch, not yet used by an acquire
        self.pinned: set[int] = set()  # kept resident until unpinned (one protect count each)
        self.needed_window: set[int] = set()  # needed by acquires since take_needed()

    def landed(self, slot: int) -> bool:
        """Whether ``slot``'s last load has landed; a landed load's event is dropped, so it
        is never queried again (``None`` means landed)."""
        event = self.ready[slot]
        if event is None:
            return True
        if event.query():
            self.ready[slot] = None
            return True
        return False

    def evictable_slots(self, keep: Sequence[int] | set[int]) -> list[int]:
        """Slots that no acquisition or pin protects and whose expert is not in ``keep``."""
        return [s for s, e in enumerate(self.slot_expert) if self.protect[s] == 0 and e not in keep]


def as_expert_list(experts: object, num_experts: int, where: str) -> list[int]:
    """Unique expert ids in first-seen order, validated.

    Raises:
        TypeError: ``experts`` is not a sequence (or tensor) of ids.
        ValueError: an id that is not an int in ``[0, num_experts)``.
    """
    if isinstance(experts, torch.Tensor):
        if experts.dim() > 1:
            experts = experts.reshape(-1)
        # A device tensor costs one host sync here: the cache's bookkeeping is on the host.
        # Callers on a hot path pass the host list they already have.
        experts = experts.tolist()
    elif hasattr(experts, "tolist") and not isinstance(experts, list | tuple | range):
        experts = experts.tolist()
    if isinstance(experts, int | str | bytes) or not isinstance(experts, Sequence):
        raise TypeError(f"{where}: experts must be a sequence of ints, got {type(experts)}")
    # The common case in C loops: plain ints (no bools, no int subclasses) in range.
    if all(type(e) is int for e in experts) and (
        not experts or (min(experts) >= 0 and max(experts) < num_experts)
    ):
        return list(dict.fromkeys(experts))
    out: dict[int, None] = {}
    for e in experts:
        if not isinstance(e, int) or isinstance(e, bool) or not 0 <= e < num_experts:
            raise ValueError(f"{where}: expert ids must be ints in [0, {num_experts}), got {e!r}")
        out[e] = None
    return list(out)


def resolve_slot_counts(
    store: ExpertStore, slots_per_layer: int | Sequence[int] | None, budget_bytes: int | None
) -> list[int]:
    """Slots of each layer from either a count (one for all layers or one per layer) or a
    device budget (every layer gets ``min(E, budget_bytes // one expert's bytes summed over
    layers)``).

    Raises:
        ValueError: both or neither given, a count outside ``[1, E]``, or a budget below one
            slot per layer.
    """
    L, E = store.num_layers, store.num_experts
    if (slots_per_layer is None) == (budget_bytes is None):
        raise ValueError("give exactly one of slots_per_layer and budget_bytes")
    if budget_bytes is not None:
        per_slot = sum(store.expert_bytes(layer) for layer in range(L))
        if not isinstance(budget_bytes, int) or budget_bytes < per_slot:
            raise ValueError(
                f"budget_bytes={budget_bytes!r} is below one slot per layer "
                f"({per_slot} bytes); give at least that"
            )
        return [min(E, budget_bytes // per_slot)] * L
    if isinstance(slots_per_layer, int):
        slots = [slots_per_layer] * L
    else:
        slots = list(slots_per_layer)  # type: ignore[arg-type]
        if len(slots) != L:
            raise ValueError(f"slots_per_layer needs {L} entries (one per layer), got {slots}")
    for s in slots:
        if not isinstance(s, int) or isinstance(s, bool) or not 1 <= s <= E:
            raise ValueError(f"slots per layer must be ints in [1, {E}], got {s!r}")
    return slots
