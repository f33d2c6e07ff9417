"""Per-layer expert slot pools on the device, fed from an ``ExpertStore``.

Each layer owns ``S`` slots. For every expert tensor name there is one device tensor shaped
``[S, *shape]`` (e.g. ``gate_up [S, 2I, H]``), and a device ``int32`` map ``expert_to_slot``
``[E]`` (``-1`` for experts that are not resident) that a grouped kernel can read. Both are
written only through the cache's copy engine, in stream order:

    wait(last use of the slot) -> map[old] = -1 -> copy tensors -> map[new] = slot -> readiness

so ``map[e] == s`` on the device implies slot ``s`` holds expert ``e`` completely, and no slot
is overwritten while a kernel recorded before its last-use event still reads it. Map updates
are 4-byte copies from a constant host table, so they need neither a kernel nor a host sync.

Verification uses ``acquire``: it yields *waves* of experts in readiness order (resident ones
first, then each loaded expert as its copy completes); the consumer computes a wave and
releases it (or simply asks for the next wave, which releases the previous one). Slots of
queued or in-use experts are protected from eviction. When a layer needs more experts than it
has slots, the released slots are reused for the remaining experts: more waves, never a
deadlock.
"""

from __future__ import annotations

import time
import warnings
from collections import deque
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import NamedTuple

import torch

from specter_cache.cache_stats import CacheStats
from specter_cache.copy_engine import (
    CopyEngine,
    CudaCopyEngine,
    TransferEvent,
    default_copy_engine,
)
from specter_cache.expert_store import ExpertStore
from specter_cache.replacement_policy import ReplacementPolicy, make_policy


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


class _LayerPool:
    """Slots of one layer: device tensors plus the host bookkeeping that mirrors them."""

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
        self.expert_to_slot = expert_to_slot  # a row of the cache's [L, E + 1] maps
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
        self.fill_candidates: dict[int, int] = {}  # slot -> expert of the last prepare_fills


def _landed(pool: _LayerPool, slot: int) -> bool:
    """Whether ``slot``'s last load has landed; a landed load's event is dropped, so it is
    never queried again (``None`` means landed)."""
    event = pool.ready[slot]
    if event is None:
        return True
    if event.query():
        pool.ready[slot] = None
        return True
    return False


def _as_expert_list(experts: object, num_experts: int, where: str) -> list[int]:
    """Unique expert ids in first-seen order, validated."""
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


class Wave:
    """A group of ready experts of one layer, handed to the consumer by ``acquire``.

    Attributes:
        layer: the layer.
        experts: expert ids of the wave (ready: the consumer's compute stream already waits
            for their copies).
        slots: their slots, aligned with ``experts``.
    """

    __slots__ = ("_acquisition", "_released", "experts", "layer", "slots")

    def __init__(self, acquisition: Acquisition, experts: tuple[int, ...], slots: tuple[int, ...]):
        self._acquisition = acquisition
        self.layer = acquisition.layer
        self.experts = experts
        self.slots = slots
        self._released = False

    @property
    def released(self) -> bool:
        """Whether the wave's slots have been released."""
        return self._released

    def release(self) -> None:
        """Record a last-use event on the current stream and unprotect the wave's slots.

        Call it after enqueueing the work that reads the slots. Idempotent.
        """
        if not self._released:
            self._acquisition._release(self)

    def __repr__(self) -> str:
        return f"Wave(layer={self.layer}, experts={list(self.experts)}, slots={list(self.slots)})"


class Acquisition:
    """One layer's needed experts, handed out in waves (see ``ExpertCache.acquire``).

    Iterate it once. Asking for the next wave releases the waves handed out before; leaving
    the loop (normally, by ``break`` or by an exception) releases everything still held.

    Attributes:
        layer: the layer.
        experts: the needed experts, unique, in the order given.
        hits: those resident or in flight when the acquisition started.
        misses: those it had to load.
    """

    def __init__(self, cache: ExpertCache, layer: int, experts: object):
        self._cache = cache
        self.layer = layer
        pool = cache._pools[layer]
        st = cache._stats.layers[layer]
        policy = cache._policy
        needed = _as_expert_list(experts, cache.num_experts, f"acquire(layer={layer})")
        self.experts = tuple(needed)
        self.hits = tuple(e for e in needed if e in pool.expert_slot)
        self.misses = tuple(e for e in needed if e not in pool.expert_slot)
        st.acquires += 1
        st.hits += len(self.hits)
        st.misses += len(self.misses)
        if len(needed) > pool.num_slots:
            st.overflow_acquires += 1
        for e in needed:
            if e in pool.prefetched:
                pool.prefetched.discard(e)
                st.prefetch_used += 1
        pool.needed_window.update(needed)
        self._ready: list[tuple[int, int]] = []
        self._pending: list[tuple[int, int, TransferEvent]] = []
        for e in self.hits:
            self._claim(e, pool.expert_slot[e])
            policy.on_access(layer, e)
        self._unissued = deque(self.misses)
        self._outstanding: list[Wave] = []
        self._closed = False
        self._iterated = False
        self._issue()

    # ------------------------------------------------------------------------- internals
    def _claim(self, expert: int, slot: int) -> None:
        pool = self._cache._pools[self.layer]
        pool.protect[slot] += 1
        if _landed(pool, slot):
            self._ready.append((expert, slot))
        else:
            self._pending.append((expert, slot, pool.ready[slot]))  # type: ignore[arg-type]

    def _issue(self) -> None:
        """Load as many unissued misses as there are evictable slots."""
        if not self._unissued:
            return
        cache, layer = self._cache, self.layer
        pool = cache._pools[layer]
        st = cache._stats.layers[layer]
        engine = cache._engine
        nbytes = cache._store.expert_bytes(layer)
        started = time.perf_counter() if engine.is_synchronous else None
        with engine.copy_context():
            while self._unissued:
                e = self._unissued[0]
                if e in pool.expert_slot:  # loaded meanwhile by a prefetch or another acquire
                    self._unissued.popleft()
                    self._claim(e, pool.expert_slot[e])
                    continue
                slot = cache._free_slot(layer, ())
                if slot is None:
                    break
                self._unissued.popleft()
                cache._load(layer, e, slot)
                cache._policy.on_access(layer, e)
                pool.protect[slot] += 1
                self._pending.append((e, slot, pool.ready[slot]))  # type: ignore[arg-type]
                st.demand_loads += 1
                st.demand_bytes += nbytes
                st.bytes_moved += nbytes
        if started is not None:
            # Synchronous CPU copies: the consumer waits for them right here.
            st.stall_seconds += time.perf_counter() - started

    def _next_wave(self) -> Wave | None:
        if not self._ready:
            self._issue()  # may also claim experts that another path loaded meanwhile
        if not self._ready:
            if not self._pending:
                if self._unissued:
                    raise RuntimeError(
                        f"acquire(layer={self.layer}): {len(self._unissued)} experts still "
                        f"need a slot, but all {self._cache._pools[self.layer].num_slots} slots "
                        "are protected by other open acquisitions of this layer; release or "
                        "close those first"
                    )
                return None
            done: list[tuple[int, int, TransferEvent]] = []
            rest: list[tuple[int, int, TransferEvent]] = []
            for item in self._pending:
                (done if item[2].query() else rest).append(item)
            if not done:
                # Nothing has arrived. The copy stream is FIFO, so waiting for one copy
                # means every earlier-issued copy has completed too.
                pool = self._cache._pools[self.layer]
                rest.sort(key=lambda item: pool.load_seq[item[1]])
                if self._cache._coalesce_arrivals:
                    # One wave for everything in flight: the compute stream waits for the
                    # last-issued copy. Fewer, larger waves, because a wave's launch and
                    # bookkeeping cost more than one expert's transfer on a fast link.
                    done, rest = rest, []
                else:
                    # The finest overlap: compute each expert as soon as it lands.
                    done, rest = rest[:1], rest[1:]
                self._cache._wait(self.layer, done[-1][2])
            self._pending = rest
            self._ready = [(e, s) for e, s, _ in done]
        experts = tuple(e for e, _ in self._ready)
        slots = tuple(s for _, s in self._ready)
        self._ready = []
        return Wave(self, experts, slots)

    def _release(self, wave: Wave) -> None:
        pool = self._cache._pools[self.layer]
        last_use = self._cache._engine.record_compute()
        for s in wave.slots:
            pool.last_use[s] = last_use
            pool.protect[s] -= 1
        wave._released = True
        self._outstanding.remove(wave)

    # ---------------------------------------------------------------------------- public
    def __iter__(self) -> Iterator[Wave]:
        if self._iterated:
            raise RuntimeError("an Acquisition can be iterated only once; acquire again")
        if self._closed:
            raise RuntimeError("this Acquisition was closed before iteration; acquire again")
        self._iterated = True
        return _WaveIterator(self)

    @property
    def closed(self) -> bool:
        """Whether every claim of the acquisition has been released."""
        return self._closed

    def close(self) -> None:
        """Release every wave and claim still held; unissued loads are dropped. Idempotent."""
        if self._closed:
            return
        for w in list(self._outstanding):
            w.release()
        pool = self._cache._pools[self.layer]
        for _, s in self._ready:
            pool.protect[s] -= 1
        for _, s, _ in self._pending:
            pool.protect[s] -= 1
        self._ready, self._pending = [], []
        self._unissued.clear()
        self._closed = True

    def __enter__(self) -> Acquisition:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _WaveIterator:
    """Iterator over an acquisition's waves; closing it (or dropping it) releases all claims."""

    __slots__ = ("_acquisition",)

    def __init__(self, acquisition: Acquisition):
        self._acquisition = acquisition

    def __iter__(self) -> _WaveIterator:
        return self

    def __next__(self) -> Wave:
        acq = self._acquisition
        if acq._closed:
            raise StopIteration
        # Asking for the next wave means the previous ones have been enqueued.
        for w in list(acq._outstanding):
            w.release()
        try:
            wave = acq._next_wave()
        except BaseException:
            acq.close()
            raise
        if wave is None:
            acq.close()
            raise StopIteration
        acq._outstanding.append(wave)
        acq._cache._stats.layers[acq.layer].waves += 1
        return wave

    def close(self) -> None:
        """Release every wave and claim of the acquisition."""
        self._acquisition.close()

    def __del__(self) -> None:
        # A `for` loop left by `break` drops its iterator: release the claims right away.
        self._acquisition.close()


class ExpertCache:
    """Device slot pools for the experts of an ``ExpertStore``.

    Args:
        store: host copy of every expert.
        slots_per_layer: slots per layer, one int for all layers or one per layer, each in
            ``[1, E]``.
        budget_bytes: alternatively, device bytes for all slots: every layer gets
            ``min(E, budget_bytes // sum of one expert's bytes over layers)`` slots.
        device: ``"cuda"`` (a copy stream, events) or ``"cpu"`` (synchronous copies).
        policy: ``"lru"``, ``"lfu"``, ``"predictive"`` or a ``ReplacementPolicy`` instance.
        copy_engine: override the copy engine (e.g. ``DeferredCopyEngine`` in CPU tests).
        coalesce_arrivals: when an acquisition's next wave finds no load completed, hand out
            every load then in flight as one wave (the compute stream waits for the last of
            them) instead of only the earliest. On by default: on DeepSeek-V2-Lite a wave's
            launches and bookkeeping cost about 1 ms, more than one 17 MB expert's 0.34 ms
            transfer, so one wave per arriving expert made verification host-bound.

    Raises:
        ValueError: both or neither of ``slots_per_layer`` and ``budget_bytes``, a slot count
            outside ``[1, E]``, a budget below one expert per layer, or an unsupported device.
        TypeError: ``store`` is not an ``ExpertStore``.

    Example:
        >>> layout = ExpertLayout({"w": ((4, 4), torch.float32)})
        >>> store = ExpertStore(1, 8, layout)
        >>> for e in range(8):
        ...     store.put(0, e, {"w": torch.full((4, 4), float(e))})
        >>> cache = ExpertCache(store, slots_per_layer=2, device="cpu")
        >>> for wave in cache.acquire(0, [3, 5, 7]):  # 3 experts, 2 slots: several waves
        ...     w = cache.slot_tensors(0)["w"][list(wave.slots)]
        >>> cache.stats()["total"]["misses"]
        3
    """

    def __init__(
        self,
        store: ExpertStore,
        *,
        slots_per_layer: int | Sequence[int] | None = None,
        budget_bytes: int | None = None,
        device: torch.device | str = "cuda",
        policy: str | ReplacementPolicy = "lru",
        copy_engine: CopyEngine | None = None,
        coalesce_arrivals: bool = True,
    ):
        if not isinstance(store, ExpertStore):
            raise TypeError(f"store must be an ExpertStore, got {type(store).__name__}")
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        L, E = store.num_layers, store.num_experts
        slots = self._resolve_slots(store, slots_per_layer, budget_bytes)
        engine = copy_engine if copy_engine is not None else default_copy_engine(device)
        if engine.device.type != device.type:
            raise ValueError(f"copy engine moves to {engine.device}, the cache is on {device}")
        if device.type == "cuda" and not store.is_pinned:
            warnings.warn(
                "ExpertStore memory is not pinned: host-to-device copies will not overlap "
                f"compute ({store.pinning_note})",
                stacklevel=2,
            )
        self._store = store
        self._device = device
        self._engine = engine
        self._coalesce_arrivals = bool(coalesce_arrivals)
        self._policy = make_policy(policy)
        self._policy.reset(L, E)
        # Every layer's device map in one tensor (row views per pool), with a spare column E
        # that scatters aim at for entries they must leave alone (``commit_fills``).
        self._maps = torch.full((L, E + 1), -1, dtype=torch.int32, device=device)
        self._pools = [
            _LayerPool(store, layer, slots[layer], device, self._maps[layer, :E])
            for layer in range(L)
        ]
        self._resident_layers: set[int] = set()  # all_resident() answers that stay True
        # Constant slot-id table the map updates copy from: entry s + 1 holds s, entry 0 holds -1.
        ids = torch.arange(-1, max(slots), dtype=torch.int32)
        if device.type == "cuda" and store.is_pinned:
            ids = ids.pin_memory()
        self._slot_ids = ids
        self._slot_id_views = [ids[i : i + 1] for i in range(len(ids))]
        self._stats = CacheStats(L)
        self._expert_bytes = [store.expert_bytes(layer) for layer in range(L)]
        self._slots = tuple(slots)  # slots per layer: fixed for the cache's life
        self._load_seq = 0
        self._stall_events: list[tuple[int, TransferEvent, TransferEvent]] = []
        self._transfers: list[tuple[int, TransferEvent, TransferEvent]] = []
        self._streaming = False
        self._streamed_use: TransferEvent | None = None
        self._map_columns: torch.Tensor | None = None  # [L, E] column ids (commit_fills)
        self._pending_counts: list[Callable[[], None]] = []  # count_later's, oldest first
        self._held: list[tuple[int, int, int, int]] = []  # prefetch(lead=)'s data copies
        # One reusable marker per layer, moved after each batch of its loads on the streamed
        # path (``wait_for_landing``); None entries where copies complete as issued.
        self._landing = [engine.landing_marker() for _ in range(L)]

    @staticmethod
    def _resolve_slots(
        store: ExpertStore, slots_per_layer: int | Sequence[int] | None, budget_bytes: int | None
    ) -> list[int]:
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

    # -------------------------------------------------------------------------- properties
    @property
    def store(self) -> ExpertStore:
        """The host store."""
        return self._store

    @property
    def device(self) -> torch.device:
        """Device of the slots."""
        return self._device

    @property
    def copy_engine(self) -> CopyEngine:
        """The engine that moves experts (its stream on CUDA)."""
        return self._engine

    @property
    def policy(self) -> ReplacementPolicy:
        """The replacement policy."""
        return self._policy

    @property
    def num_layers(self) -> int:
        """Number of layers ``L``."""
        return self._store.num_layers

    @property
    def num_experts(self) -> int:
        """Experts per layer ``E``."""
        return self._store.num_experts

    @property
    def slots_per_layer(self) -> tuple[int, ...]:
        """Slots of each layer."""
        return self._slots

    @property
    def device_bytes(self) -> int:
        """Device bytes of all slot tensors (the maps excluded)."""
        return sum(
            p.num_slots * self._store.expert_bytes(layer) for layer, p in enumerate(self._pools)
        )

    def slot_tensors(self, layer: int) -> dict[str, torch.Tensor]:
        """name -> ``[S, *shape]`` device tensor of ``layer``'s slots (do not reassign)."""
        return self._pools[self._check_layer(layer)].tensors

    def expert_to_slot(self, layer: int) -> torch.Tensor:
        """``[E]`` int32 device map of ``layer``: slot of each expert, ``-1`` if not resident.

        Kept current in copy-stream order: an entry ``map[e] = s`` appears only after slot
        ``s`` holds ``e`` completely. Only the experts of a wave are guaranteed ready for the
        compute stream.
        """
        return self._pools[self._check_layer(layer)].expert_to_slot

    def fill_candidates(self) -> list[dict[int, int]]:
        """Per layer, the candidates of the last :meth:`prepare_fills` not yet counted by
        ``record_streamed`` (slot -> the expert it held, -1: empty); copies."""
        return [dict(pool.fill_candidates) for pool in self._pools]

    def expert_to_slot_maps(self) -> torch.Tensor:
        """``[L, E]`` int32 view of every layer's device map (see :meth:`expert_to_slot`)."""
        return self._maps[:, : self.num_experts]

    def slot_states(self, layer: int) -> list[SlotInfo]:
        """Host view of every slot of ``layer`` (for inspection and tests)."""
        self.settle()
        pool = self._pools[self._check_layer(layer)]
        return [
            SlotInfo(e, pool.ready[s] is None or pool.ready[s].query(), pool.protect[s])  # type: ignore[union-attr]
            for s, e in enumerate(pool.slot_expert)
        ]

    def all_resident(self, layer: int) -> bool:
        """Whether every expert of ``layer`` is loaded in a slot of its own.

        Only a layer with a slot per expert can be; once it is, nothing can evict anything
        there (every acquire hits, every prefetch is a no-op), so it stays so: a True answer
        is remembered here. Checks load completion without blocking.
        """
        layer = self._check_layer(layer)
        if layer in self._resident_layers:
            return True
        pool = self._pools[layer]
        if pool.num_slots < self._store.num_experts:
            return False  # whatever the queued counts hold: no settling (and waiting) here
        self.settle()
        resident = all(e >= 0 for e in pool.slot_expert) and all(
            _landed(pool, s) for s in range(pool.num_slots)
        )
        if resident:
            self._resident_layers.add(layer)
        return resident

    def every_layer_resident(self) -> bool:
        """Whether every expert of every layer is loaded in a slot of its own (no budget):
        nothing will ever be loaded again."""
        return all(self.all_resident(layer) for layer in range(len(self._pools)))

    def resident_experts(self, layer: int) -> list[int]:
        """Experts of ``layer`` that hold a slot (loaded or in flight), by slot order."""
        self.settle()
        return [e for e in self._pools[self._check_layer(layer)].slot_expert if e >= 0]

    def slot_of(self, layer: int, expert: int) -> int:
        """Slot of ``expert`` (loaded or in flight), ``-1`` if it is not resident."""
        self.settle()
        pool = self._pools[self._check_layer(layer)]
        return pool.expert_slot.get(expert, -1)

    # ------------------------------------------------------------------------------ queries
    def lookup(self, layer: int, experts: object) -> tuple[list[int], list[int]]:
        """Split ``experts`` of ``layer`` into (resident or in flight, missing).

        Args:
            experts: expert ids (duplicates removed, first-seen order kept).

        Returns:
            ``(resident, missing)`` lists of expert ids.
        """
        self.settle()
        pool = self._pools[self._check_layer(layer)]
        ids = _as_expert_list(experts, self.num_experts, f"lookup(layer={layer})")
        return [e for e in ids if e in pool.expert_slot], [
            e for e in ids if e not in pool.expert_slot
        ]

    # ----------------------------------------------------------------------------- loading
    def set_plan(self, plan: Mapping[int, Sequence[int]]) -> None:
        """Hand the planner's ranked per-layer plan to the policy (the predictive one uses it)."""
        self.settle()
        self._policy.set_plan(self._check_plan(plan))

    def prefetch(
        self,
        plan: Mapping[int, Sequence[int]],
        *,
        set_plan: bool = False,
        lead: int | None = None,
    ) -> dict[int, list[int]]:
        """Start loading the planned experts that are not resident, asynchronously.

        Per layer, experts are taken in plan order (most wanted first); each load evicts a
        policy-chosen expert that is neither protected nor in the layer's plan. When no slot can
        be freed the rest of that layer's plan is dropped (counted as ``prefetch_dropped``).

        The host decides every load of the plan first, then issues them as one batch: on the
        streamed path the evicted experts leave the device map in one invalidation ahead of
        every data copy, and each event the copy stream must wait for is waited for once
        (the copies stay in plan order; a layer's loads share one readiness event).

        With ``lead`` on the streamed path, only the first ``lead`` loads' data copies are
        issued now; the others' are *held* until :meth:`release_copies`, so a caller can
        launch a streamed verification first and issue the rest while it runs (their host
        time then overlaps the device's work). Everything that makes a held copy safe is
        issued now: the invalidation of every evicted expert and the copy stream's waits for
        every slot's last use and the last streamed verification. A held expert keeps its
        ``-1`` on the device map until its copy lands, so a verification launched in between
        streams it, with the same bits.

        Args:
            plan: ``layer -> ranked expert ids``.
            set_plan: hand the plan to the policy first, as :meth:`set_plan` does (one
                validation for both).
            lead: loads whose data copies go out now (None: all); applies on the streamed
                path only (the acquire path issues every copy at once).

        Returns:
            ``layer -> experts whose loads were issued or held`` (each with a readiness
            event once its copies are issued).

        Raises:
            ValueError: a bad plan, or ``lead`` that is not None or an int >= 0.
        """
        if lead is not None and (not isinstance(lead, int) or isinstance(lead, bool) or lead < 0):
            raise ValueError(
                f"lead must be None (issue every data copy now) or an int >= 0 (data copies "
                f"issued before the rest are held for release_copies), got {lead!r}"
            )
        self.release_copies()
        self.settle()
        checked = self._check_plan(plan)
        if set_plan:
            self._policy.set_plan(checked)
        issued: dict[int, list[int]] = {}
        loads: list[tuple[int, int, int, int]] = []  # (layer, expert, slot, evicted expert)
        for layer, experts in checked.items():
            pool = self._pools[layer]
            st = self._stats.layers[layer]
            planned = set(experts)
            loaded: list[int] = []
            evictable: list[int] | None = None  # slots a load may take, made on first need
            for i, e in enumerate(experts):
                if e in pool.expert_slot:
                    continue
                if pool.empty:
                    slot = pool.empty.pop()
                else:
                    if evictable is None:
                        evictable = self._evictable_slots(pool, planned)
                    slot = self._victim_slot(layer, evictable)
                if slot is None:
                    st.prefetch_dropped += sum(1 for x in experts[i:] if x not in pool.expert_slot)
                    break
                loads.append((layer, e, slot, self._assign(layer, e, slot)))
                pool.prefetched.add(e)
                loaded.append(e)
            nbytes = len(loaded) * self._expert_bytes[layer]
            st.prefetch_loads += len(loaded)
            st.prefetch_bytes += nbytes
            st.bytes_moved += nbytes
            issued[layer] = loaded
        if loads:
            self._copy_in(loads, lead=lead if self._streaming else None)
        return issued

    @property
    def copies_held(self) -> int:
        """Loads whose data copies :meth:`prefetch` holds for :meth:`release_copies`."""
        return len(self._held)

    def release_copies(self) -> int:
        """Issue the data copies :meth:`prefetch` held (``lead``), in plan order; returns how
        many loads they were. Every method that issues copies or reads readiness (``prefetch``,
        ``acquire``, ``pin``, ``unpin``, ``prepare_fills``, ``synchronize``,
        ``completed_transfers``, ``stats``, ``reset_stats``, the ``streaming`` switch) releases
        first, so a held copy can only be late, never lost or out of order."""
        held, self._held = self._held, []
        if held:
            with self._engine.copy_context():
                self._copy_data(held, timed=True)
        return len(held)

    def pin(self, layer: int, experts: object) -> list[int]:
        """Keep ``experts`` of ``layer`` resident until :meth:`unpin`.

        Missing ones are loaded as a prefetch is (asynchronously, counted as prefetch loads,
        but never as wasted); every pinned expert's slot is then excluded from eviction, so
        the policy chooses among the other slots only.

        Args:
            layer: the layer.
            experts: expert ids (already pinned ones are skipped).

        Returns:
            The experts newly pinned.

        Raises:
            ValueError: bad ids, or pins that would leave a layer with fewer slots than
                experts no evictable slot (nothing else could ever be loaded there).
            RuntimeError: a slot could not be freed because open acquisitions hold every
                other one (pin between forwards).
        """
        layer = self._check_layer(layer)
        self.release_copies()
        self.settle()
        pool = self._pools[layer]
        ids = _as_expert_list(experts, self.num_experts, f"pin(layer={layer})")
        new = [e for e in ids if e not in pool.pinned]
        total = len(pool.pinned) + len(new)
        if pool.num_slots < self.num_experts and total >= pool.num_slots:
            raise ValueError(
                f"pinning {total} experts of layer {layer} leaves none of its "
                f"{pool.num_slots} slots evictable; pin at most {pool.num_slots - 1}"
            )
        missing = [e for e in new if e not in pool.expert_slot]
        if missing:
            loaded = self.prefetch({layer: missing}).get(layer, [])
            pool.prefetched.difference_update(loaded)  # pinned on purpose: never wasted
            if len(loaded) != len(missing):
                raise RuntimeError(
                    f"pin(layer={layer}): only {len(loaded)} of {len(missing)} missing experts "
                    "found a slot; open acquisitions protect the rest, so pin between forwards"
                )
        for e in new:
            pool.protect[pool.expert_slot[e]] += 1
            pool.pinned.add(e)
        return new

    def unpin(self, layer: int, experts: object) -> list[int]:
        """Make pinned ``experts`` of ``layer`` evictable again; returns those unpinned."""
        layer = self._check_layer(layer)
        self.release_copies()
        self.settle()
        pool = self._pools[layer]
        ids = _as_expert_list(experts, self.num_experts, f"unpin(layer={layer})")
        done = [e for e in ids if e in pool.pinned]
        for e in done:
            pool.protect[pool.expert_slot[e]] -= 1
            pool.pinned.discard(e)
        return done

    def pinned(self, layer: int) -> list[int]:
        """The pinned experts of ``layer``, sorted."""
        return sorted(self._pools[self._check_layer(layer)].pinned)

    def acquire(self, layer: int, experts: object) -> Acquisition:
        """Claim ``experts`` of ``layer`` for computation; iterate the result for waves.

        Needed experts that are resident are protected at once; missing ones are loaded into
        evictable slots (more as waves are released). Waves come in readiness order: the
        resident experts first, then loaded ones as their copies complete (the current compute
        stream waits on each copy's readiness event; the host does not block).

        Args:
            layer: the layer.
            experts: the experts needed (ids; duplicates removed). A device tensor costs one
                host sync.

        Returns:
            An ``Acquisition``: ``for wave in cache.acquire(layer, experts): ...``.

        Raises:
            ValueError: bad layer or expert ids.
        """
        layer = self._check_layer(layer)
        self.release_copies()
        self.settle()
        return Acquisition(self, layer, experts)

    # ------------------------------------------------------------------- streamed misses
    @property
    def streaming(self) -> bool:
        """Whether verifications read missing experts in place from host memory (the
        streamed miss path) instead of acquiring them: loads then keep the map safe for a
        consumer that reads any slot through ``expert_to_slot`` without a wave (see
        ``stream_guard``). Set it between forwards."""
        return self._streaming

    @streaming.setter
    def streaming(self, enabled: bool) -> None:
        self.release_copies()
        self.settle()
        self._streaming = bool(enabled)

    def host_tensors(self, layer: int, name: str) -> list[torch.Tensor]:
        """Tensor ``name`` of every expert of ``layer`` in the host store (views into its
        pinned memory, read from their sources first where needed), by expert id: what a
        kernel on the streamed miss path reads for experts without a slot.

        Raises:
            ValueError: a bad layer or a name the layout does not have.
        """
        layer = self._check_layer(layer)
        if name not in self._pools[layer].names:
            raise ValueError(
                f"layer {layer}'s experts have tensors {list(self._pools[layer].names)}, "
                f"not {name!r}"
            )
        return [self._store.get(layer, e)[name] for e in range(self.num_experts)]

    def stream_guard(self, *, settle: bool = True) -> None:
        """Make the current (compute) stream wait until every slot's map entry is safe to
        read: each expert taken off the map by a load issued so far is off it. Call it
        before a streamed verification; slots still loading keep their ``-1`` until their
        copies land, so the verification streams those experts instead. With the copy
        stream's data copies left running, this waits for a few tiny copies only.
        ``settle=False`` leaves the queued counts queued (a pipelined plain step: counts
        issue no loads, so the invalidations waited for are the same)."""
        if settle:
            self.settle()
        event = self._engine.invalidations_done()
        if event is not None:
            event.wait()

    def wait_for_landing(self, layer: int) -> None:
        """Make the current (compute) stream wait until every load of ``layer`` issued so
        far on the streamed path has landed, its map entry included, so that a streamed
        verification reads those experts from their slots instead of streaming them while
        their copies still cross the link (each would cross twice).

        The host does not block. Each batch of a layer's loads moves one reusable marker
        (``CopyEngine.landing_marker``), so a CUDA graph captures this wait once, as a wait
        on an external event, and every replay waits for the loads issued before it was
        launched; a layer with no loads since waits for nothing new. Copies that
        ``prefetch(lead=)`` holds are not issued yet and are not waited for. On the CPU the
        deferred engine runs its queue up to the layer's last load; the immediate engine has
        nothing to wait for.

        Issue no load that must wait for a streamed forward (every load after its
        ``mark_streamed_use``) while that forward may still be waiting here: the wait
        covers the loads issued before its launch (tested on the H200), and should CUDA
        resolve it to a later batch instead, the two would wait on each other. A decode
        loop that reads each verification's tokens before planning the next prefetch never
        does; the held copies ``release_copies`` issues after a launch wait for the forward
        before it only.

        Raises:
            ValueError: a layer outside ``[0, num_layers)``.
        """
        self._engine.wait_landing(self._landing[self._check_layer(layer)])

    def mark_streamed_use(self) -> None:
        """A streamed verification has been enqueued on the current stream: later loads
        overwrite no slot before it is done (it may have read any of them)."""
        self._streamed_use = self._engine.record_compute()

    def count_later(self, count: Callable[[], None]) -> None:
        """Queue ``count``, a streamed forward's bookkeeping (its ``record_streamed`` calls),
        to run at the cache's next decision or read instead of now.

        A streamed forward's record reaches the host in one copy after the forward: counting
        it at once makes the host wait for the whole forward and then work while the device
        idles. Queued, the record's copy goes out without a wait and the counting runs when
        something depends on it: every method that reads or changes the cache's bookkeeping
        (``lookup``, ``prefetch``, ``set_plan``, ``acquire``, ``pin``, ``prepare_fills``,
        ``stream_guard``, ``take_needed``, ``expire_prefetches``, ``stats``, ...) calls
        :meth:`settle` first, so every decision sees exactly the counts it saw before. A
        caller may launch its next device work (a draft forward) before the host counts,
        and the counting overlaps it.

        Raises:
            TypeError: ``count`` is not callable.
        """
        if not callable(count):
            raise TypeError(f"count_later needs a callable, got {type(count).__name__}")
        self._pending_counts.append(count)

    @property
    def counts_pending(self) -> int:
        """How many queued counts (``count_later``) have not run yet."""
        return len(self._pending_counts)

    def settle(self) -> None:
        """Run the queued counts of :meth:`count_later`, oldest first (a no-op without any)."""
        while self._pending_counts:
            self._pending_counts.pop(0)()

    def prepare_fills(
        self,
        spares_per_layer: int,
        *,
        exclude: Sequence[Collection[int]] | None = None,
        settle: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Before a streamed verification with fills: each layer's candidate slots.

        A *fill* (specter-kernels' ``streamed_fills``) writes an expert the verification
        streams into a slot as it reads it, so the expert is resident afterwards with no
        load. Each layer offers up to ``spares_per_layer`` candidates, the first to take
        first: its empty slots, then the slots of the experts the policy would evict first
        among those neither protected (pinned, claimed), prefetched and not yet used (the
        draft's predictions for this verification) nor still loading. Nothing is evicted
        here: the verification evicts a candidate's expert only to fill its slot, and only
        where the layer does not route to that expert (``assign_fill_slots``).

        Pipelined (``settle=False``, with ``exclude``): the counts still queued are left
        queued, so the host's slots are those before the forwards they count; the slots
        those forwards were offered (``exclude``, one collection per layer) are the only
        ones those forwards may have changed, and are not offered. Their candidates then go
        to ``record_streamed(candidates=)``, since a later call replaces the ones kept here.

        Args:
            spares_per_layer: the most candidates per layer (>= 1).
            exclude: per layer, slots not to offer (the pending forwards' candidates).
            settle: run the queued counts first (the default).

        Returns:
            ``(spare_slots, spare_experts, claimed)``: CPU int32 ``[L, F]`` candidate slots
            per layer (-1 after the last; ``F = spares_per_layer``), ``[L, F]`` the expert
            each holds (-1: empty), and ``[L, E]`` the host's slot of each expert, loads in
            flight included (-1: none; only those experts may be filled, since one still
            loading holds a slot already). Hand them to the verification, then its fills
            to ``commit_fills`` and ``record_streamed``.

        Raises:
            ValueError: ``spares_per_layer`` is not an int >= 1.
        """
        self.release_copies()
        if settle:
            self.settle()
        if exclude is not None and len(exclude) != self.num_layers:
            raise ValueError(
                f"exclude needs one collection of slots per layer ({self.num_layers}), got "
                f"{len(exclude)}"
            )
        if (
            not isinstance(spares_per_layer, int)
            or isinstance(spares_per_layer, bool)
            or spares_per_layer < 1
        ):
            raise ValueError(
                f"spares_per_layer must be an int >= 1 (candidate slots per layer for "
                f"streamed fills), got {spares_per_layer!r}"
            )
        E, F = self.num_experts, spares_per_layer
        slots_out: list[list[int]] = []
        experts_out: list[list[int]] = []
        claimed: list[list[int]] = []
        for layer, pool in enumerate(self._pools):
            skip = exclude[layer] if exclude is not None else ()
            order = [s for s in pool.empty[::-1] if s not in skip][:F]  # as pop() hands out
            holders = [-1] * len(order)
            if len(order) < F:
                candidates = [
                    e
                    for s, e in enumerate(pool.slot_expert)
                    if e >= 0 and pool.protect[s] == 0 and e not in pool.prefetched
                    and s not in skip and _landed(pool, s)
                ]  # fmt: skip
                for victim in self._policy.choose_victims(layer, candidates, F - len(order)):
                    order.append(pool.expert_slot[victim])
                    holders.append(victim)
            pool.fill_candidates = dict(zip(order, holders, strict=True))
            pad = [-1] * (F - len(order))
            slots_out.append(order + pad)
            experts_out.append(holders + pad)
            row = [-1] * E
            for e, slot in pool.expert_slot.items():
                row[e] = slot
            claimed.append(row)
        # Built as lists, one tensor each: no per-element tensor writes on the host.
        return (
            torch.tensor(slots_out, dtype=torch.int32),
            torch.tensor(experts_out, dtype=torch.int32),
            torch.tensor(claimed, dtype=torch.int32),
        )

    def commit_fills(self, fills: torch.Tensor) -> None:
        """Put the experts a streamed verification filled on the device map, on the current
        stream after it (no host sync): ``map[l, e] = fills[l, e]`` where that is a slot.

        Only those entries are written (a scatter, no read-modify-write of the others),
        since the copy stream may be changing other entries meanwhile. Call
        ``record_streamed(..., filled=)`` with the same fills once they are on the host.

        Args:
            fills: int32 ``[L, E]`` on the cache's device: each layer's fill slots
                (``assign_fill_slots``), -1 where nothing was filled.

        Raises:
            TypeError: a wrong dtype, shape or device.
        """
        L, E = self.num_layers, self.num_experts
        if (
            fills.dtype != torch.int32
            or tuple(fills.shape) != (L, E)
            or fills.device != self._device
        ):
            raise TypeError(
                f"fills must be int32 [L={L}, E={E}] on {self._device}, got {fills.dtype} "
                f"{tuple(fills.shape)} on {fills.device}"
            )
        filled = fills >= 0
        if self._map_columns is None:
            self._map_columns = torch.arange(E, device=self._device).expand(L, E)
        target = torch.where(filled, self._map_columns, E)  # the others aim at the spare column
        self._maps.scatter_(1, target, torch.where(filled, fills, -1))

    def record_streamed(
        self,
        layer: int,
        needed: object,
        streamed: object,
        filled: Mapping[int, int] | None = None,
        candidates: Mapping[int, int] | None = None,
    ) -> None:
        """Count a streamed verification of ``layer``: ``needed`` (the experts it routed to)
        hit where they held a slot, and ``streamed`` (those it read from host memory) missed.

        Updates what an acquire would have: hits, misses (``streamed_reads`` and their bytes
        in ``bytes_moved``), prefetches used, the policy's recency and the window of needed
        experts (``take_needed``). Nothing is loaded.

        ``filled`` (expert -> slot): streamed experts the verification also wrote into
        candidate slots of ``prepare_fills`` (``commit_fills`` put them on the device map).
        They now hold those slots, ready once the verification is done, and the experts the
        slots held are evicted (``streamed_fills``). ``candidates`` (slot -> the expert it
        held, -1: empty): this forward's candidates of the layer, where a later
        ``prepare_fills`` has replaced the ones the cache kept (pipelined steps).

        Raises:
            ValueError: bad layer or expert ids, a streamed expert that was not needed, or a
                fill that is not a streamed expert into a spare slot.
        """
        layer = self._check_layer(layer)
        pool = self._pools[layer]
        st = self._stats.layers[layer]
        needed_ids = _as_expert_list(needed, self.num_experts, f"record_streamed(layer={layer})")
        streamed_ids = set(
            _as_expert_list(streamed, self.num_experts, f"record_streamed(layer={layer})")
        )
        if not streamed_ids <= set(needed_ids):
            raise ValueError(
                f"record_streamed(layer={layer}): streamed experts {sorted(streamed_ids)} must "
                f"be among the needed ones {needed_ids}"
            )
        if candidates is None:
            candidates, pool.fill_candidates = pool.fill_candidates, {}
        for e, slot in (filled or {}).items():
            if (
                e not in streamed_ids
                or e in pool.expert_slot
                or slot not in candidates
                or candidates[slot] != pool.slot_expert[slot]
            ):
                raise ValueError(
                    f"record_streamed(layer={layer}): fill of expert {e} into slot {slot} "
                    "must be a streamed expert holding no slot, into a candidate slot of "
                    "the last prepare_fills"
                )
            if pool.slot_expert[slot] < 0:
                pool.empty.remove(slot)
            # The verification took the old expert off the device map and wrote this one.
            self._assign(layer, e, slot)
            pool.ready[slot] = pool.last_use[slot] = self._streamed_use
            self._load_seq += 1
            pool.load_seq[slot] = self._load_seq
            st.streamed_fills += 1
        nbytes = self._expert_bytes[layer]
        st.acquires += 1
        st.misses += len(streamed_ids)
        st.hits += len(needed_ids) - len(streamed_ids)
        st.streamed_reads += len(streamed_ids)
        st.streamed_histogram[len(streamed_ids)] = (
            st.streamed_histogram.get(len(streamed_ids), 0) + 1
        )
        st.streamed_bytes += len(streamed_ids) * nbytes
        st.bytes_moved += len(streamed_ids) * nbytes
        for e in needed_ids:
            if e in streamed_ids:
                continue  # read from the host (a prefetch still in flight stays pending)
            if e in pool.prefetched:
                pool.prefetched.discard(e)
                st.prefetch_used += 1
            if e in pool.expert_slot:
                self._policy.on_access(layer, e)
        pool.needed_window.update(needed_ids)

    def expire_prefetches(self) -> int:
        """End the prefetch window: prefetched experts not used so far count as wasted.

        Returns:
            How many prefetched experts were never used.
        """
        self.settle()
        wasted = 0
        for pool, st in zip(self._pools, self._stats.layers, strict=True):
            st.prefetch_wasted += len(pool.prefetched)
            wasted += len(pool.prefetched)
            pool.prefetched.clear()
        return wasted

    def take_needed(self) -> dict[int, set[int]]:
        """Experts needed by acquires and streamed verifications since the last call, per
        layer (then forgotten)."""
        self.settle()
        out = {layer: p.needed_window for layer, p in enumerate(self._pools) if p.needed_window}
        for p in self._pools:
            p.needed_window = set()
        return out

    def synchronize(self) -> None:
        """Block the host until every issued copy (and held one) has completed."""
        self.release_copies()
        self._engine.synchronize()

    # ------------------------------------------------------------------------- statistics
    def completed_transfers(self) -> list[tuple[int, float]]:
        """``(bytes, seconds)`` of prefetch batches completed since the last call.

        Never blocks: batches still in flight are kept for a later call.
        """
        self.release_copies()
        done, keep = [], []
        for item in self._transfers:
            (done if item[2].query() else keep).append(item)
        self._transfers = keep
        return [(n, start.elapsed_seconds(end)) for n, start, end in done]

    def _resolve_stalls(self, block: bool) -> None:
        keep = []
        for layer, start, end in self._stall_events:
            if block or end.query():
                self._stats.layers[layer].stall_seconds += start.elapsed_seconds(end)
            else:
                keep.append((layer, start, end))
        self._stall_events = keep

    def stats(self) -> dict[str, object]:
        """Counters per layer and in total, with rates (see ``cache_stats``).

        On CUDA this waits for the stall-timing events it reads (a host sync): call it
        outside the decode loop.
        """
        self.release_copies()
        self.settle()
        self._resolve_stalls(block=True)
        out = self._stats.as_dict()
        out["slots_per_layer"] = list(self.slots_per_layer)
        out["device_bytes"] = self.device_bytes
        out["policy"] = self._policy.name
        return out

    def reset_stats(self) -> None:
        """Zero every counter (pending stall timings are dropped; pending counts are made
        first, then zeroed with the rest)."""
        self.release_copies()
        self.settle()
        self._stall_events.clear()
        self._stats.reset()

    # --------------------------------------------------------------------------- internals
    def _check_layer(self, layer: object) -> int:
        if (
            not isinstance(layer, int)
            or isinstance(layer, bool)
            or not 0 <= layer < self.num_layers
        ):
            raise ValueError(f"layer must be an int in [0, {self.num_layers}), got {layer!r}")
        return layer

    def _check_plan(self, plan: Mapping[int, Sequence[int]]) -> dict[int, list[int]]:
        if not isinstance(plan, Mapping):
            raise TypeError(f"a plan maps layer -> expert ids, got {type(plan).__name__}")
        return {
            self._check_layer(layer): _as_expert_list(
                experts, self.num_experts, f"plan[layer {layer}]"
            )
            for layer, experts in plan.items()
        }

    def _free_slot(self, layer: int, keep: Sequence[int] | set[int]) -> int | None:
        """An empty slot, or the slot of a policy-chosen evictable expert not in ``keep``."""
        pool = self._pools[layer]
        if pool.empty:
            return pool.empty.pop()
        return self._victim_slot(layer, self._evictable_slots(pool, keep))

    @staticmethod
    def _evictable_slots(pool: _LayerPool, keep: Sequence[int] | set[int]) -> list[int]:
        """Slots of ``pool`` that no acquisition or pin protects and whose expert is not in
        ``keep``."""
        return [s for s, e in enumerate(pool.slot_expert) if pool.protect[s] == 0 and e not in keep]

    def _victim_slot(self, layer: int, evictable: list[int]) -> int | None:
        """The slot of the policy's victim among the experts in ``evictable`` slots (removed
        from the list: it will hold an expert that is kept), or None when it is empty."""
        if not evictable:
            return None
        pool = self._pools[layer]
        candidates = [pool.slot_expert[s] for s in evictable]
        victim = self._policy.choose_victim(layer, candidates)
        if victim not in candidates:
            raise RuntimeError(
                f"policy {self._policy.name!r} chose expert {victim!r} in layer {layer}, which "
                f"is not one of the evictable candidates {candidates}"
            )
        slot = pool.expert_slot[victim]
        evictable.remove(slot)
        return slot

    def _assign(self, layer: int, expert: int, slot: int) -> int:
        """The host's side of a load: ``slot`` now holds ``expert``; returns the expert it
        evicted (-1: the slot was empty). The copies are :meth:`_copy_in`'s."""
        pool = self._pools[layer]
        old = pool.slot_expert[slot]
        if old >= 0:
            del pool.expert_slot[old]
            self._policy.on_evict(layer, old)
            st = self._stats.layers[layer]
            st.evictions += 1
            if old in pool.prefetched:
                pool.prefetched.discard(old)
                st.prefetch_wasted += 1
        pool.slot_expert[slot] = expert
        pool.expert_slot[expert] = slot
        self._policy.on_insert(layer, expert)
        return old

    def _load(self, layer: int, expert: int, slot: int) -> None:
        """Enqueue loading ``expert`` into ``slot`` (inside ``copy_context``)."""
        self._copy_in([(layer, expert, slot, self._assign(layer, expert, slot))], timed=False)

    def _copy_in(
        self,
        loads: Sequence[tuple[int, int, int, int]],
        timed: bool = True,
        lead: int | None = None,
    ) -> None:
        """Enqueue the copies of ``loads`` (``(layer, expert, slot, evicted expert)``, already
        assigned on the host), in order, each with a readiness event.

        A slot is overwritten only after its last use by compute. On the streamed path also
        after the last streamed verification, and each evicted expert first leaves the
        device map, after its slot's previous load and last wave (one invalidation for the
        batch: a verification that then finds -1 reads the expert from the host). The map
        entry of a loaded expert is written after its data. ``timed``: time the batch from
        its first data copy, for the bandwidth estimate (``completed_transfers``). ``lead``:
        issue the data copies of the first ``lead`` loads only and hold the others (see
        ``prefetch``); the waits and the invalidation above cover them all.
        """
        engine = self._engine
        with engine.copy_context():
            for layer, _, slot, _ in loads:
                engine.wait_for(self._pools[layer].last_use[slot])
            if self._streaming:
                engine.wait_for(self._streamed_use)
                evicted = [(layer, old, slot) for layer, _, slot, old in loads if old >= 0]
                if evicted:
                    after: list[TransferEvent | None] = []
                    for layer, _, slot in evicted:
                        pool = self._pools[layer]
                        after += (pool.ready[slot], pool.last_use[slot])
                    engine.invalidate(
                        [self._pools[layer].map_views[old] for layer, old, _ in evicted],
                        self._slot_id_views[0],
                        after,
                    )
            now = loads if lead is None else loads[:lead]
            self._held.extend(loads[len(now) :])
            self._copy_data(now, timed)

    def _copy_data(self, loads: Sequence[tuple[int, int, int, int]], timed: bool) -> None:
        """Enqueue the data copies and map entries of ``loads`` (inside ``copy_context``,
        after their waits and invalidation), one readiness event per layer run."""
        if not loads:
            return
        engine = self._engine
        start = engine.record(timing=True) if timed else None
        nbytes = 0
        group: list[int] = []  # slots of the layer being loaded, ready at one event
        for i, (layer, expert, slot, old) in enumerate(loads):
            pool = self._pools[layer]
            if not self._streaming and old >= 0:
                engine.copy(pool.map_views[old], self._slot_id_views[0])
            src = self._store.get(layer, expert)
            for dst, name in zip(pool.slot_views[slot], pool.names, strict=True):
                engine.copy(dst, src[name])
            engine.copy(pool.map_views[expert], self._slot_id_views[slot + 1])
            self._load_seq += 1
            pool.load_seq[slot] = self._load_seq
            nbytes += self._expert_bytes[layer]
            group.append(slot)
            if i + 1 == len(loads) or loads[i + 1][0] != layer:
                # One readiness event per layer of the batch, after its last load (its
                # map entries, which a streamed verification goes by, land one by one).
                ready = engine.record()
                for s in group:
                    pool.ready[s] = ready
                group = []
                if self._streaming:
                    engine.mark_landing(self._landing[layer])
        if start is not None:
            self._transfers.append((nbytes, start, engine.record(timing=True)))

    def _wait(self, layer: int, event: TransferEvent) -> None:
        """Make the compute stream wait for ``event``, timing the stall."""
        if isinstance(self._engine, CudaCopyEngine):
            start = self._engine.record_compute(timing=True)
            event.wait()
            self._stall_events.append((layer, start, self._engine.record_compute(timing=True)))
            if len(self._stall_events) > 1024:
                self._resolve_stalls(block=False)
        else:
            started = time.perf_counter()
            event.wait()
            self._stats.layers[layer].stall_seconds += time.perf_counter() - started

    def __repr__(self) -> str:
        return (
            f"ExpertCache(layers={self.num_layers}, slots={list(self.slots_per_layer)}, "
            f"device={self._device}, policy={self._policy.name!r}, "
            f"device_bytes={self.device_bytes / 1e9:.3f} GB)"
        )
