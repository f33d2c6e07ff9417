"""Acquisitions: a layer's needed experts handed to the consumer in waves.

``ExpertCache.acquire`` returns an ``Acquisition``. Needed experts that are resident are
protected at once; missing ones are loaded into evictable slots (more as waves are
released). Iterating it yields *waves* in readiness order (resident experts first, then each
loaded expert as its copy completes); the consumer computes a wave and releases it (or asks
for the next wave, which releases the previous one). When a layer needs more experts than it
has slots, the released slots are reused for the remaining experts: more waves, never a
deadlock.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator

from specter_cache.copy_engine import TransferEvent
from specter_cache.copy_pipeline import CopyPipeline
from specter_cache.residency import Residency


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

    def __init__(
        self,
        residency: Residency,
        copies: CopyPipeline,
        layer: int,
        experts: object,
        coalesce_arrivals: bool = True,
    ):
        self._residency = residency
        self._copies = copies
        self._coalesce_arrivals = coalesce_arrivals
        self.layer = layer
        pool = residency.pools[layer]
        st = residency.stats.layers[layer]
        policy = residency.policy
        needed = residency.expert_ids(experts, f"acquire(layer={layer})")
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
        pool = self._residency.pools[self.layer]
        pool.protect[slot] += 1
        if pool.landed(slot):
            self._ready.append((expert, slot))
        else:
            self._pending.append((expert, slot, pool.ready[slot]))  # type: ignore[arg-type]

    def _issue(self) -> None:
        """Load as many unissued misses as there are evictable slots."""
        if not self._unissued:
            return
        residency, copies, layer = self._residency, self._copies, self.layer
        pool = residency.pools[layer]
        st = residency.stats.layers[layer]
        engine = copies.engine
        nbytes = residency.expert_bytes[layer]
        started = time.perf_counter() if engine.is_synchronous else None
        with engine.copy_context():
            while self._unissued:
                e = self._unissued[0]
                if e in pool.expert_slot:  # loaded meanwhile by a prefetch or another acquire
                    self._unissued.popleft()
                    self._claim(e, pool.expert_slot[e])
                    continue
                slot = residency.free_slot(layer, ())
                if slot is None:
                    break
                self._unissued.popleft()
                copies.copy_in([(layer, e, slot, residency.assign(layer, e, slot))], timed=False)
                residency.policy.on_access(layer, e)
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
                        f"need a slot, but all {self._residency.pools[self.layer].num_slots} slots "
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
                pool = self._residency.pools[self.layer]
                rest.sort(key=lambda item: pool.load_seq[item[1]])
                if self._coalesce_arrivals:
                    # One wave for everything in flight: the compute stream waits for the
                    # last-issued copy. Fewer, larger waves, because a wave's launch and
                    # bookkeeping cost more than one expert's transfer on a fast link.
                    done, rest = rest, []
                else:
                    # The finest overlap: compute each expert as soon as it lands.
                    done, rest = rest[:1], rest[1:]
                self._copies.wait(self.layer, done[-1][2])
            self._pending = rest
            self._ready = [(e, s) for e, s, _ in done]
        experts = tuple(e for e, _ in self._ready)
        slots = tuple(s for _, s in self._ready)
        self._ready = []
        return Wave(self, experts, slots)

    def _release(self, wave: Wave) -> None:
        pool = self._residency.pools[self.layer]
        last_use = self._copies.engine.record_compute()
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
        pool = self._residency.pools[self.layer]
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
        acq._residency.stats.layers[acq.layer].waves += 1
        return wave

    def close(self) -> None:
        """Release every wave and claim of the acquisition."""
        self._acquisition.close()

    def __del__(self) -> None:
        # A `for` loop left by `break` drops its iterator: release the claims right away.
        self._acquisition.close()
