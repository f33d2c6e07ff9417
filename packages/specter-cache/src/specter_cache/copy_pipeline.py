"""The copy pipeline: how a decided load reaches its slot, in copy-stream order.

Slot tensors and device maps are written only through the copy engine, in stream order:

    wait(last use of the slot) -> map[old] = -1 -> copy tensors -> map[new] = slot -> readiness

so ``map[e] == s`` on the device implies slot ``s`` holds expert ``e`` completely, and no slot
is overwritten while a kernel recorded before its last-use event still reads it. Map updates
are 4-byte copies from a constant host table of slot ids, so they need neither a kernel nor
a host sync.

On the streamed path (``streaming``: a consumer reads any slot through the map without a
wave) a batch of loads also waits for the last streamed forward (``mark_streamed_use``),
takes every evicted expert off the map in one invalidation ahead of its data copies, and
moves the layer's landing marker after each layer's loads (``wait_for_landing``). Data
copies may be *held* (``copy_in(lead=)``) and issued later by ``release_held``.

The pipeline also times what it moves: batches of prefetches (``completed_transfers``, for
the planner's bandwidth estimate) and the compute stream's stalls on arriving loads.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from specter_cache.cache_stats import CacheStats
from specter_cache.copy_engine import CopyEngine, CudaCopyEngine, TransferEvent
from specter_cache.expert_store import ExpertStore
from specter_cache.residency import Load
from specter_cache.slot_pool import LayerPool


class CopyPipeline:
    """Issues the copies of loads decided by ``Residency``.

    Args:
        engine: the copy engine (a copy stream and events on CUDA).
        store: the host store the data comes from.
        pools: every layer's slot pool (the residency's).
        stats: the residency's statistics (stall time is added here).
        device: device of the slots.
    """

    def __init__(
        self,
        engine: CopyEngine,
        store: ExpertStore,
        pools: list[LayerPool],
        stats: CacheStats,
        device: torch.device,
    ):
        # Constant slot-id table the map updates copy from: entry s + 1 holds s, entry 0 holds -1.
        ids = torch.arange(-1, max(p.num_slots for p in pools), dtype=torch.int32)
        if device.type == "cuda" and store.is_pinned:
            ids = ids.pin_memory()
        self._slot_ids = ids
        self._slot_id_views = [ids[i : i + 1] for i in range(len(ids))]
        self.engine = engine
        self._store = store
        self._pools = pools
        self._stats = stats
        self._expert_bytes = [store.expert_bytes(layer) for layer in range(len(pools))]
        self._load_seq = 0
        self._stall_events: list[tuple[int, TransferEvent, TransferEvent]] = []
        self._transfers: list[tuple[int, TransferEvent, TransferEvent]] = []
        self._held: list[Load] = []  # data copies held by copy_in(lead=)
        self.streaming = False
        self.streamed_use: TransferEvent | None = None  # the last streamed forward
        # One reusable marker per layer, moved after each batch of its loads on the streamed
        # path (``wait_for_landing``); None entries where copies complete as issued.
        self._landing = [engine.landing_marker() for _ in pools]

    # ----------------------------------------------------------------------------- loads
    def copy_in(
        self,
        loads: Sequence[Load],
        timed: bool = True,
        lead: int | None = None,
    ) -> None:
        """Enqueue the copies of ``loads`` (already assigned on the host), in order, each
        with a readiness event.

        A slot is overwritten only after its last use by compute. On the streamed path also
        after the last streamed forward, and each evicted expert first leaves the device
        map, after its slot's previous load and last wave (one invalidation for the batch: a
        forward that then finds -1 reads the expert from the host). The map entry of a loaded
        expert is written after its data. ``timed``: time the batch from its first data copy
        (``completed_transfers``). ``lead``: issue the data copies of the first ``lead``
        loads only and hold the others for ``release_held``; the waits and the invalidation
        cover them all.
        """
        engine = self.engine
        with engine.copy_context():
            for layer, _, slot, _ in loads:
                engine.wait_for(self._pools[layer].last_use[slot])
            if self.streaming:
                engine.wait_for(self.streamed_use)
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

    def _copy_data(self, loads: Sequence[Load], timed: bool) -> None:
        """Enqueue the data copies and map entries of ``loads`` (inside ``copy_context``,
        after their waits and invalidation), one readiness event per layer run."""
        if not loads:
            return
        engine = self.engine
        start = engine.record(timing=True) if timed else None
        nbytes = 0
        group: list[int] = []  # slots of the layer being loaded, ready at one event
        for i, (layer, expert, slot, old) in enumerate(loads):
            pool = self._pools[layer]
            if not self.streaming and old >= 0:
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
                # map entries, which a streamed forward goes by, land one by one).
                ready = engine.record()
                for s in group:
                    pool.ready[s] = ready
                group = []
                if self.streaming:
                    engine.mark_landing(self._landing[layer])
        if start is not None:
            self._transfers.append((nbytes, start, engine.record(timing=True)))

    @property
    def copies_held(self) -> int:
        """Loads whose data copies are held for ``release_held``."""
        return len(self._held)

    def release_held(self) -> int:
        """Issue the held data copies in their order; returns how many loads they were."""
        held, self._held = self._held, []
        if held:
            with self.engine.copy_context():
                self._copy_data(held, timed=True)
        return len(held)

    def adopt_fill(self, pool: LayerPool, slot: int) -> None:
        """``slot`` was written by the last streamed forward (a fill): it is ready, and last
        used, when that forward is done, and counts as the latest load of the slot."""
        pool.ready[slot] = pool.last_use[slot] = self.streamed_use
        self._load_seq += 1
        pool.load_seq[slot] = self._load_seq

    # ------------------------------------------------------------------- compute stream
    def mark_streamed_use(self) -> None:
        """A streamed forward has been enqueued on the current stream: later loads wait
        for it."""
        self.streamed_use = self.engine.record_compute()

    def guard_invalidations(self) -> None:
        """Make the current stream wait for every map invalidation issued so far."""
        event = self.engine.invalidations_done()
        if event is not None:
            event.wait()

    def wait_for_landing(self, layer: int) -> None:
        """Make the current stream wait for ``layer``'s landing marker (its loads issued so
        far on the streamed path)."""
        self.engine.wait_landing(self._landing[layer])

    def wait(self, layer: int, event: TransferEvent) -> None:
        """Make the compute stream wait for ``event``, timing the stall."""
        if isinstance(self.engine, CudaCopyEngine):
            start = self.engine.record_compute(timing=True)
            event.wait()
            self._stall_events.append((layer, start, self.engine.record_compute(timing=True)))
            if len(self._stall_events) > 1024:
                self.resolve_stalls(block=False)
        else:
            started = time.perf_counter()
            event.wait()
            self._stats.layers[layer].stall_seconds += time.perf_counter() - started

    # ---------------------------------------------------------------------------- timing
    def resolve_stalls(self, block: bool) -> None:
        """Add the timed stalls to the statistics (those complete, or all with ``block``)."""
        keep = []
        for layer, start, end in self._stall_events:
            if block or end.query():
                self._stats.layers[layer].stall_seconds += start.elapsed_seconds(end)
            else:
                keep.append((layer, start, end))
        self._stall_events = keep

    def drop_stall_timings(self) -> None:
        """Forget the stalls not yet added to the statistics."""
        self._stall_events.clear()

    def completed_transfers(self) -> list[tuple[int, float]]:
        """``(bytes, seconds)`` of timed batches completed since the last call (never
        blocks: batches in flight are kept)."""
        done, keep = [], []
        for item in self._transfers:
            (done if item[2].query() else keep).append(item)
        self._transfers = keep
        return [(n, start.elapsed_seconds(end)) for n, start, end in done]
