"""``ExpertCache``: per-layer expert slot pools on the device, fed from an ``ExpertStore``.

The cache composes three parts, one concept each:

* ``Residency`` (``residency.py``, over ``slot_pool.py``): which expert holds which slot,
  eviction by the replacement policy, pins, lookups and statistics.
* ``CopyPipeline`` (``copy_pipeline.py``): how a load reaches its slot in copy-stream order,
  held copies, transfer and stall timing.
* ``StreamedMisses`` (``streamed_misses.py``, the cache's ``streamed``): the protocol of
  forwards that read missing experts from host memory instead of acquiring them.

Verification uses ``acquire`` (``acquisition.py``): it yields *waves* of experts in
readiness order, resident ones first, then each loaded expert as its copy completes.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence

import torch

from specter_cache.acquisition import Acquisition
from specter_cache.copy_engine import CopyEngine, default_copy_engine
from specter_cache.copy_pipeline import CopyPipeline
from specter_cache.expert_store import ExpertStore
from specter_cache.replacement_policy import ReplacementPolicy
from specter_cache.residency import Residency
from specter_cache.slot_pool import SlotInfo, resolve_slot_counts
from specter_cache.streamed_misses import StreamedMisses


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
        slots = resolve_slot_counts(store, slots_per_layer, budget_bytes)
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
        self._slots = tuple(slots)  # slots per layer: fixed for the cache's life
        self._coalesce_arrivals = bool(coalesce_arrivals)
        self._residency = Residency(store, slots, device, policy)
        self._copies = CopyPipeline(
            engine, store, self._residency.pools, self._residency.stats, device
        )
        self._streamed = StreamedMisses(self._residency, self._copies, store)
        self._host_experts: tuple[frozenset[int], ...] = (frozenset(),) * store.num_layers

    # ------------------------------------------------------------------------ properties
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
        return self._copies.engine

    @property
    def policy(self) -> ReplacementPolicy:
        """The replacement policy."""
        return self._residency.policy

    @property
    def streamed(self) -> StreamedMisses:
        """The streamed-miss protocol of this cache: what a consumer that reads missing
        experts in place from host memory calls instead of ``acquire``."""
        return self._streamed

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
        return sum(n * self._store.expert_bytes(layer) for layer, n in enumerate(self._slots))

    # ---------------------------------------------------------------- device-side views
    def slot_tensors(self, layer: int) -> dict[str, torch.Tensor]:
        """name -> ``[S, *shape]`` device tensor of ``layer``'s slots (do not reassign)."""
        return self._residency.pools[self._residency.check_layer(layer)].tensors

    def expert_to_slot(self, layer: int) -> torch.Tensor:
        """``[E]`` int32 device map of ``layer``: slot of each expert, ``-1`` if not resident.

        Kept current in copy-stream order: an entry ``map[e] = s`` appears only after slot
        ``s`` holds ``e`` completely. Only the experts of a wave are guaranteed ready for the
        compute stream.
        """
        return self._residency.pools[self._residency.check_layer(layer)].expert_to_slot

    def expert_to_slot_maps(self) -> torch.Tensor:
        """``[L, E]`` int32 view of every layer's device map (see :meth:`expert_to_slot`)."""
        return self._residency.maps[:, : self.num_experts]

    # ------------------------------------------------------------------ host-side lookups
    def lookup(self, layer: int, experts: object) -> tuple[list[int], list[int]]:
        """Split ``experts`` of ``layer`` (duplicates removed, first-seen order kept) into
        ``(resident or in flight, missing)`` lists of expert ids."""
        return self._residency.lookup(layer, experts)

    def slot_states(self, layer: int) -> list[SlotInfo]:
        """Host view of every slot of ``layer`` (for inspection and tests)."""
        return self._residency.slot_states(layer)

    def all_resident(self, layer: int) -> bool:
        """Whether every expert of ``layer`` is loaded in a slot of its own.

        Only a layer with a slot per expert can be; once it is, nothing can evict anything
        there (every acquire hits, every prefetch is a no-op), so it stays so: a True answer
        is remembered. Checks load completion without blocking.
        """
        return self._residency.all_resident(layer)

    def every_layer_resident(self) -> bool:
        """Whether every expert of every layer is loaded in a slot of its own (no budget):
        nothing will ever be loaded again."""
        return all(self._residency.all_resident(layer) for layer in range(self.num_layers))

    def resident_experts(self, layer: int) -> list[int]:
        """Experts of ``layer`` that hold a slot (loaded or in flight), by slot order."""
        return self._residency.resident_experts(layer)

    def slot_of(self, layer: int, expert: int) -> int:
        """Slot of ``expert`` (loaded or in flight), ``-1`` if it is not resident."""
        return self._residency.slot_of(layer, expert)

    def pinned(self, layer: int) -> list[int]:
        """The pinned experts of ``layer``, sorted."""
        return self._residency.pinned(layer)

    # ------------------------------------------------------------- host-computed experts
    @property
    def host_experts(self) -> tuple[frozenset[int], ...]:
        """Per layer, the experts a consumer computes on the host from the store itself
        (CPU-homed: specter-models' CPU expert executor), which the cache never loads."""
        return self._host_experts

    def set_host_experts(self, experts: Sequence[Sequence[int]] | None) -> None:
        """Mark the CPU-homed experts of every layer (None: none). From now on a prefetch
        plan drops them, and pinning one is refused; one already in a slot stays until the
        policy evicts it (nothing reads it there).

        Raises:
            ValueError: not one list of ids in ``[0, E)`` per layer, or a pinned expert.
        """
        if experts is None:
            self._host_experts = (frozenset(),) * self.num_layers
            return
        sets = [frozenset(int(e) for e in layer) for layer in experts]
        E = self.num_experts
        if len(sets) != self.num_layers or any(not 0 <= e < E for s in sets for e in s):
            raise ValueError(
                f"host experts need one list of expert ids in [0, {E}) per layer "
                f"({self.num_layers}), got {experts!r}"
            )
        for layer, homed in enumerate(sets):
            if pinned := sorted(homed & set(self.pinned(layer))):
                raise ValueError(
                    f"layer {layer}: experts {pinned} are pinned in slots; a host-computed "
                    "expert cannot be pinned (unpin them or home other experts)"
                )
        self._host_experts = tuple(sets)

    def without_host_experts(self, plan: Mapping[int, Sequence[int]]) -> dict[int, list[int]]:
        """``plan`` (layer -> ranked expert ids) less the host-computed experts, order kept."""
        host = self._host_experts
        return {
            layer: [e for e in experts if int(e) not in host[layer]]
            if 0 <= layer < self.num_layers
            else list(experts)
            for layer, experts in plan.items()
        }

    # --------------------------------------------------------------------------- loading
    def set_plan(self, plan: Mapping[int, Sequence[int]]) -> None:
        """Hand the planner's ranked per-layer plan to the policy (the predictive one uses it)."""
        self._residency.settle()
        self._residency.policy.set_plan(self._residency.check_plan(plan))

    def prefetch(
        self,
        plan: Mapping[int, Sequence[int]],
        *,
        set_plan: bool = False,
        lead: int | None = None,
    ) -> dict[int, list[int]]:
        """Start loading the planned experts that are not resident, asynchronously.

        Host-computed experts (``set_host_experts``) are dropped from the plan. Per layer,
        experts are taken in plan order (most wanted first); each load evicts a
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
        residency, copies = self._residency, self._copies
        copies.release_held()
        residency.settle()
        if any(self._host_experts) and isinstance(plan, Mapping):
            plan = self.without_host_experts(plan)
        checked = residency.check_plan(plan)
        if set_plan:
            residency.policy.set_plan(checked)
        issued, loads = residency.prefetch_loads(checked)
        if loads:
            copies.copy_in(loads, lead=lead if copies.streaming else None)
        return issued

    @property
    def copies_held(self) -> int:
        """Loads whose data copies :meth:`prefetch` holds for :meth:`release_copies`."""
        return self._copies.copies_held

    def release_copies(self) -> int:
        """Issue the data copies :meth:`prefetch` held (``lead``), in plan order; returns how
        many loads they were. Every method that issues copies or reads readiness (``prefetch``,
        ``acquire``, ``pin``, ``unpin``, ``prepare_fills``, ``synchronize``,
        ``completed_transfers``, ``stats``, ``reset_stats``, the ``streaming`` switch) releases
        first, so a held copy can only be late, never lost or out of order."""
        return self._copies.release_held()

    def pin(self, layer: int, experts: object) -> list[int]:
        """Keep ``experts`` of ``layer`` resident until :meth:`unpin`.

        Missing ones are loaded as a prefetch is (asynchronously, counted as prefetch loads,
        but never as wasted); every pinned expert's slot is then excluded from eviction, so
        the policy chooses among the other slots only.

        Returns:
            The experts newly pinned (already pinned ones are skipped).

        Raises:
            ValueError: bad ids, pins that would leave a layer with fewer slots than
                experts no evictable slot (nothing else could ever be loaded there), or a
                host-computed expert (``set_host_experts``).
            RuntimeError: a slot could not be freed because open acquisitions hold every
                other one (pin between forwards).
        """
        layer = self._residency.check_layer(layer)
        self._copies.release_held()
        new, missing = self._residency.pins_to_add(layer, experts)
        if homed := sorted(set(new) & self._host_experts[layer]):
            raise ValueError(
                f"layer {layer}: experts {homed} are computed on the host (set_host_experts); "
                "a pinned expert stays in a slot, so it cannot be host-computed too"
            )
        loaded = self.prefetch({layer: missing}).get(layer, []) if missing else []
        self._residency.add_pins(layer, new, missing, loaded)
        return new

    def unpin(self, layer: int, experts: object) -> list[int]:
        """Make pinned ``experts`` of ``layer`` evictable again; returns those unpinned."""
        layer = self._residency.check_layer(layer)
        self._copies.release_held()
        return self._residency.unpin(layer, experts)

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
        layer = self._residency.check_layer(layer)
        self._copies.release_held()
        self._residency.settle()
        return Acquisition(self._residency, self._copies, layer, experts, self._coalesce_arrivals)

    def synchronize(self) -> None:
        """Block the host until every issued copy (and held one) has completed."""
        self._copies.release_held()
        self._copies.engine.synchronize()

    # ------------------------------------------------------------------ streamed path
    @property
    def streaming(self) -> bool:
        """Whether forwards read missing experts in place from host memory (the streamed
        miss path, ``streamed``) instead of acquiring them: loads then keep the map safe for
        a consumer that reads any slot through ``expert_to_slot`` without a wave (see
        ``streamed.stream_guard``). Set it between forwards."""
        return self._copies.streaming

    @streaming.setter
    def streaming(self, enabled: bool) -> None:
        self._copies.release_held()
        self._residency.settle()
        self._copies.streaming = bool(enabled)

    # ------------------------------------------------------------------- deferred counts
    def count_later(self, count: Callable[[], None]) -> None:
        """Queue ``count`` (a streamed forward's ``record_streamed`` calls, a prefetcher's
        closing) to run at the cache's next decision or read instead of now.

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
        self._residency.count_later(count)

    @property
    def counts_pending(self) -> int:
        """How many queued counts (``count_later``) have not run yet."""
        return self._residency.counts_pending

    def settle(self) -> None:
        """Run the queued counts of :meth:`count_later`, oldest first (a no-op without any)."""
        self._residency.settle()

    # ------------------------------------------------------------------------ statistics
    def expire_prefetches(self) -> int:
        """End the prefetch window: prefetched experts not used so far count as wasted;
        returns how many."""
        return self._residency.expire_prefetches()

    def take_needed(self) -> dict[int, set[int]]:
        """Experts needed by acquires and streamed forwards since the last call, per layer
        (then forgotten)."""
        return self._residency.take_needed()

    def completed_transfers(self) -> list[tuple[int, float]]:
        """``(bytes, seconds)`` of prefetch batches completed since the last call.

        Never blocks: batches still in flight are kept for a later call.
        """
        self._copies.release_held()
        return self._copies.completed_transfers()

    def stats(self) -> dict[str, object]:
        """Counters per layer and in total, with rates (see ``cache_stats``).

        On CUDA this waits for the stall-timing events it reads (a host sync): call it
        outside the decode loop.
        """
        self._copies.release_held()
        self._residency.settle()
        self._copies.resolve_stalls(block=True)
        out = self._residency.stats.as_dict()
        out["slots_per_layer"] = list(self.slots_per_layer)
        out["device_bytes"] = self.device_bytes
        out["policy"] = self._residency.policy.name
        return out

    def reset_stats(self) -> None:
        """Zero every counter (pending stall timings are dropped; pending counts are made
        first, then zeroed with the rest)."""
        self._copies.release_held()
        self._residency.settle()
        self._copies.drop_stall_timings()
        self._residency.stats.reset()

    def __repr__(self) -> str:
        return (
            f"ExpertCache(layers={self.num_layers}, slots={list(self.slots_per_layer)}, "
            f"device={self._device}, policy={self.policy.name!r}, "
            f"device_bytes={self.device_bytes / 1e9:.3f} GB)"
        )
