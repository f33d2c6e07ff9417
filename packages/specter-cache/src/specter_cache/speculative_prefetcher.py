"""The speculation observer: routing counter, prefetch planner and expert cache, tied together.

A speculative-decoding controller (e.g. specter-spec's) calls four methods on the object it
is given, by duck typing:

* ``on_draft_start(depth)``: a draft of ``depth`` tokens begins; counters are cleared.
* ``on_draft_token(index)``: draft token ``index`` (0-based) is produced; during its forward
  the model's MoE layers called ``counter.observe(layer, topk_ids)``. At a chunk boundary the
  counters are snapshotted (one small device-to-host copy), the plan goes to the cache's policy
  and the non-resident planned experts are prefetched on the copy stream. Pipelined (the
  default on CUDA), the snapshot is only queued at the boundary and read at the next draft
  token, after that token's forward is queued: the host never waits for the draft it just
  launched, and plans while the device drafts (prefetches go out one draft token later).
* ``on_verify_start(num_tokens)``: drafting is over; a pending snapshot is read, and if still
  predicting, one last snapshot and prefetch, then the counters are cleared.
* ``on_verify_end(num_accepted)``: the window closes; prefetched experts the target did not use
  count as wasted; the planned experts are scored against those the target needed. Deferred
  (the default on CUDA), the closing is queued on the cache (``ExpertCache.count_later``)
  behind the stream record's counts, and runs at the next draft token or verification start,
  once the next forward is queued (or when anything reads the cache): the host's bookkeeping
  of a verification overlaps the next draft instead of holding its launch back.
* ``plain_steps_may_overlap()``: True once every expert is resident, so a controller may
  queue plain steps one ahead of each other.

Layer-wise final plans (``layerwise``, with a publishing counter, ``RoutingCounter.publish``):
at the draft's last token the host does not wait for the whole forward to plan. Each MoE
layer's counts reach the host as the draft computes it, and the host plans and prefetches
each run of layers that has arrived while the device computes the layers after it, so the
copy engine starts during the draft and the verification launches right after it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence

from specter_cache.copy_engine import TransferEvent
from specter_cache.expert_cache import ExpertCache
from specter_cache.prefetch_planner import PlannerPhase, PrefetchPlanner
from specter_cache.routing_counter import PendingSnapshot, RoutingCounter


class SpeculativePrefetcher:
    """Implements the speculation observer protocol on top of an ``ExpertCache``.

    Args:
        cache: the target's expert cache.
        counter: the draft's routing counters (same ``L`` and ``E`` as the cache).
        planner: the prefetch planner (default: ``PrefetchPlanner()``).
        top_m: experts planned per layer at a snapshot; default: the cache's slots per layer.
        pipelined: read each boundary's snapshot at the next draft token instead of waiting
            for it (None: on when the counters live on a CUDA device).
        deferred_close: queue ``on_verify_end``'s closing on the cache, to run once the next
            forward is queued (None: on when the counters live on a CUDA device). Every
            decision and statistic sees the same counts either way.
        verify_lead: at verification start, issue the data copies of this many loads of
            the plan and hold the rest (``ExpertCache.prefetch(lead=)``) for whoever launches
            the verification to release after the launch (specter-models' streamed target
            does); None (the default): every copy before the launch. On the streamed path
            only; a held expert not yet landed is streamed, with the same bits.
        layerwise: plan the draft's last token layer by layer as its forward publishes its
            counts (see the module docstring); needs ``counter.publish()`` before the draft's
            forwards are captured (without it, or without rows, the final plan is a
            snapshot, as with False, the default). The same plans as a final snapshot's up
            to ties between equal counts; ``verify_lead`` does not apply there.

    Once every expert of every layer is resident (a budget that holds them all) there is
    nothing to prefetch: boundaries are skipped, with no snapshot and no host sync.

    Raises:
        ValueError: counter and cache disagree on ``L`` or ``E``.

    Example:
        >>> prefetcher = SpeculativePrefetcher(cache, RoutingCounter(L, E, "cpu"))  # doctest: +SKIP
        >>> prefetcher.on_draft_start(depth=8)  # doctest: +SKIP
    """

    def __init__(
        self,
        cache: ExpertCache,
        counter: RoutingCounter,
        planner: PrefetchPlanner | None = None,
        *,
        top_m: int | Sequence[int] | None = None,
        pipelined: bool | None = None,
        deferred_close: bool | None = None,
        verify_lead: int | None = None,
        layerwise: bool = False,
    ):
        if (counter.num_layers, counter.num_experts) != (cache.num_layers, cache.num_experts):
            raise ValueError(
                f"RoutingCounter is [{counter.num_layers}, {counter.num_experts}] but the cache "
                f"has {cache.num_layers} layers of {cache.num_experts} experts"
            )
        self.cache = cache
        self.counter = counter
        self.planner = planner or PrefetchPlanner()
        if top_m is None:
            self.top_m: list[int] = list(cache.slots_per_layer)
        elif isinstance(top_m, int):
            self.top_m = [top_m] * cache.num_layers
        else:
            self.top_m = list(top_m)
        if len(self.top_m) != cache.num_layers or any(
            not isinstance(m, int) or m < 1 for m in self.top_m
        ):
            raise ValueError(f"top_m must be a positive int or one per layer, got {top_m!r}")
        self._tokens_done = 0
        self._drafting = False
        self._markers: list[TransferEvent] = []
        self._timed_upto = 0
        self._planned: list[set[int]] = [set() for _ in range(cache.num_layers)]
        self.pipelined = counter.device.type == "cuda" if pipelined is None else bool(pipelined)
        self._pending: tuple[int, PendingSnapshot] | None = None  # (tokens done, snapshot)
        on_cuda = counter.device.type == "cuda"
        self.deferred_close = on_cuda if deferred_close is None else bool(deferred_close)
        if verify_lead is not None and (
            not isinstance(verify_lead, int) or isinstance(verify_lead, bool) or verify_lead < 0
        ):
            raise ValueError(
                f"verify_lead must be None (every copy before the verification) or an int >= 0 "
                f"(loads issued before its launch), got {verify_lead!r}"
            )
        self.verify_lead = verify_lead
        self.layerwise = bool(layerwise)
        self._generation = 0  # the publishing counter's stamp of the draft's last forward
        self.reset_stats()

    # ------------------------------------------------------------------ observer protocol
    def on_draft_start(self, depth: int) -> None:
        """A draft of ``depth`` tokens begins (cold start).

        Raises:
            ValueError: ``depth`` is not a non-negative int.
        """
        self.planner.begin_draft(depth)
        self.counter.clear()
        self._stamp_last_forward(0)
        self._tokens_done = 0
        self._drafting = True
        self._pending = None
        self._planned = [set() for _ in range(self.cache.num_layers)]
        self._markers = [self.cache.copy_engine.record_compute(timing=True)]
        self._timed_upto = 0
        self._stats["drafts"] += 1

    def on_draft_token(self, index: int) -> None:
        """Draft token ``index`` (0-based) has been produced; maybe a chunk boundary.

        Raises:
            RuntimeError: no draft was started.
            ValueError: ``index`` is not the next token of the draft.
        """
        if not self._drafting:
            raise RuntimeError("on_draft_token() before on_draft_start(); start a draft first")
        if index != self._tokens_done:
            raise ValueError(
                f"draft token index {index!r} out of order: expected {self._tokens_done} "
                "(indices are 0-based and consecutive within a draft)"
            )
        self.cache.settle()  # the last verification's counts, while this draft token runs
        self._tokens_done += 1
        self._stats["draft_tokens"] += 1
        self._markers.append(self.cache.copy_engine.record_compute(timing=True))
        if self._pending is not None:  # the previous boundary's snapshot, read now
            self._finish_boundary(drafting_done=False)
        if (
            self._layerwise_now()
            and self._tokens_done == self.planner.depth
            and self.planner.predicting
            and not self.cache.every_layer_resident()
        ):
            self._layerwise_final()
        elif self.planner.is_boundary(self._tokens_done) and not self.cache.every_layer_resident():
            self._pending = (self._tokens_done, self.counter.snapshot_async(self.top_m))
            if not self.pipelined:
                self._finish_boundary(drafting_done=False)
        self._stamp_last_forward(self._tokens_done)

    def on_verify_start(self, num_tokens: int) -> None:
        """Verification of ``num_tokens`` rows begins: final snapshot if still predicting.

        Raises:
            ValueError: ``num_tokens`` is not a positive int.
        """
        if not isinstance(num_tokens, int) or isinstance(num_tokens, bool) or num_tokens < 1:
            raise ValueError(f"num_tokens must be a positive int, got {num_tokens!r}")
        self.cache.settle()
        if self._pending is not None:
            # A snapshot of every draft token is the last one: it is the final boundary.
            self._finish_boundary(
                drafting_done=self._pending[0] == self._tokens_done, lead=self.verify_lead
            )
        if (
            self._drafting
            and self.planner.predicting
            and self._tokens_done > 0
            and not self.cache.every_layer_resident()
        ):
            self._pending = (self._tokens_done, self.counter.snapshot_async(self.top_m))
            self._finish_boundary(drafting_done=True, lead=self.verify_lead)
        self.planner.end_draft()
        self.counter.clear()
        self._drafting = False
        self.cache.take_needed()  # the window of needed experts starts now
        self._stats["verifications"] += 1

    def on_verify_end(self, num_accepted: int) -> None:
        """Verification is over: score the plan, expire unused prefetches.

        Raises:
            ValueError: ``num_accepted`` is not a non-negative int.
        """
        if not isinstance(num_accepted, int) or isinstance(num_accepted, bool) or num_accepted < 0:
            raise ValueError(f"num_accepted must be a non-negative int, got {num_accepted!r}")
        planned, self._planned = self._planned, [set() for _ in range(self.cache.num_layers)]
        close = functools.partial(self._close_window, num_accepted, planned)
        if self.deferred_close:
            self.cache.count_later(close)
        else:
            close()

    def warm_up(self) -> None:
        """Take one routing snapshot of the counters as they stand and read it, changing
        nothing: the snapshot's first use (on CUDA its ranking kernels' module loads and its
        pinned host buffer) happens now instead of at the first draft's first boundary.

        Cold, that first snapshot held DeepSeek-V2-Lite's first draft at 24 GB on an H200
        for 66 ms of host time (later ones take about 0.1 ms): a first ``generate``
        iteration drafting 3 proposals took 82 ms against 19 after a warm-up, and an
        adaptive depth learned drafting as 10 times dearer than it is. Call it once after
        loading (specter-models' loader does), never during a draft.

        Raises:
            RuntimeError: a draft is in progress (its boundaries own the counters' reads).
        """
        if self._drafting:
            raise RuntimeError(
                "warm_up() during a draft; call it before drafting starts (after loading)"
            )
        self.counter.snapshot_async(self.top_m).result()

    def plain_steps_may_overlap(self) -> bool:
        """Whether a controller may queue plain (K = 0) steps ahead of each other's
        ``on_verify_end``: only once every expert of every layer is resident, when there is
        nothing left to load, plan or score (see specter-spec's ``pipeline_plain``)."""
        return self.cache.every_layer_resident()

    # ------------------------------------------------------------------------- internals
    def _close_window(self, num_accepted: int, planned_sets: list[set[int]]) -> None:
        """Close a verification's window: score its plan against the experts the target
        needed, expire the prefetches it did not use."""
        needed = self.cache.take_needed()
        st = self._stats
        for layer, planned in enumerate(planned_sets):
            used = needed.get(layer, set())
            st["planned_experts"] += len(planned)
            st["needed_experts"] += len(used)
            st["planned_and_needed"] += len(planned & used)
        self.cache.expire_prefetches()
        st["accepted_tokens"] += num_accepted

    def _feed_measurements(self) -> None:
        for nbytes, seconds in self.cache.completed_transfers():
            self.planner.observe_bandwidth(nbytes, seconds)
        # Per-token draft time from the newest completed marker (never blocks).
        for j in range(len(self._markers) - 1, self._timed_upto, -1):
            if self._markers[j].query():
                start = self._markers[self._timed_upto]
                seconds = start.elapsed_seconds(self._markers[j])
                self.planner.observe_token_time(seconds / (j - self._timed_upto))
                self._timed_upto = j
                break

    def _finish_boundary(self, *, drafting_done: bool, lead: int | None = None) -> None:
        """Read the pending snapshot (one small device-to-host copy), plan and prefetch
        (``lead``: as ``ExpertCache.prefetch``'s, at verification start)."""
        assert self._pending is not None
        tokens_done, snapshot = self._pending
        self._pending = None
        self._feed_measurements()
        batch = [0, 0, 0]
        self._plan_and_prefetch(snapshot.result(), batch, lead)
        self._decide(tokens_done, batch, drafting_done)

    def _plan_and_prefetch(
        self, plan: Mapping[int, list[int]], batch: list[int], lead: int | None = None
    ) -> None:
        """Record ``plan`` (some layers), add its batch's experts, bytes and remaining slots
        to ``batch``, and prefetch it (the policy gets the plan first). Experts the host
        computes (``ExpertCache.set_host_experts``) are left out: they are never loaded."""
        cache = self.cache
        if any(cache.host_experts):
            plan = cache.without_host_experts(plan)
        slots = cache.slots_per_layer
        for layer, experts in plan.items():
            self._planned[layer].update(experts)
            new = cache.lookup(layer, experts)[1]
            batch[0] += len(new)
            batch[1] += len(new) * cache.store.expert_bytes(layer)
            # Only evictable slots can take a prefetch: pinned ones (a hot set) hold their
            # experts for good, planned or not.
            pinned = set(cache.pinned(layer))
            held = sum(1 for e in experts if e not in pinned) - len(new)
            batch[2] += max(0, slots[layer] - len(pinned) - held)
        issued = cache.prefetch(plan, set_plan=True, lead=lead)
        self._stats["prefetch_issued"] += sum(len(v) for v in issued.values())

    def _decide(self, tokens_done: int, batch: list[int], drafting_done: bool) -> None:
        """The planner's decision on a boundary's whole batch, and its counters."""
        decision = self.planner.decide(
            tokens_done,
            batch_experts=batch[0],
            batch_bytes=batch[1],
            remaining_slots=batch[2],
            drafting_done=drafting_done,
        )
        st = self._stats
        st["boundaries"] += 1
        if decision.phase is PlannerPhase.FINAL_CLEANUP:
            st["cleanups"] += 1
            st["cleanup_tokens"] += tokens_done
            self.counter.clear()

    def _layerwise_now(self) -> bool:
        return self.layerwise and self.counter.publishing

    def _stamp_last_forward(self, tokens_done: int) -> None:
        """Before the draft's last forward is queued, stamp the rows it will publish."""
        if self._layerwise_now() and tokens_done == self.planner.depth - 1:
            self._generation = self.counter.begin_forward()

    def _layerwise_final(self) -> None:
        """The final boundary, planned layer by layer as the last draft forward publishes
        its counts: each run of layers whose rows have arrived is planned and prefetched at
        once, while the device computes the layers after it. Once the forward is known done
        (its marker), a row that never arrived (a forward that did not publish) falls back
        to a snapshot for the layers left."""
        self._feed_measurements()
        counter, num_layers = self.counter, self.cache.num_layers
        forward_done = self._markers[-1]
        batch = [0, 0, 0]
        fallback: dict[int, list[int]] | None = None
        layer = 0
        while layer < num_layers:
            ready: dict[int, list[int]] = {}
            while layer < num_layers:
                if fallback is not None:
                    ready[layer] = fallback[layer]
                else:
                    counts = counter.published(layer, self._generation)
                    if counts is None:
                        break
                    ready[layer] = counter.rank(counts, self.top_m[layer])
                layer += 1
            if ready:
                self._plan_and_prefetch(ready, batch)
                self._stats["layerwise_batches"] += 1
            elif forward_done.query() and counter.published(layer, self._generation) is None:
                fallback = counter.snapshot_async(self.top_m).result()
                self._stats["layerwise_fallbacks"] += 1
        self._stats["layerwise_boundaries"] += 1
        self._decide(self._tokens_done, batch, drafting_done=True)

    # ------------------------------------------------------------------------ statistics
    def reset_stats(self) -> None:
        """Zero the prefetcher's counters (the cache's are reset with ``cache.reset_stats``);
        a window still to close is closed first, into the counters being zeroed."""
        self.cache.settle()
        self._stats = {
            "drafts": 0,
            "draft_tokens": 0,
            "verifications": 0,
            "accepted_tokens": 0,
            "boundaries": 0,
            "cleanups": 0,
            "cleanup_tokens": 0,
            "prefetch_issued": 0,
            "planned_experts": 0,
            "needed_experts": 0,
            "planned_and_needed": 0,
            "layerwise_boundaries": 0,
            "layerwise_batches": 0,
            "layerwise_fallbacks": 0,
        }

    def stats(self) -> dict[str, object]:
        """The prefetcher's counters plus plan precision and recall.

        ``plan_precision``: planned experts the target then needed / planned experts;
        ``plan_recall``: needed experts that had been planned / needed experts (per layer,
        summed over verification windows). ``cache`` holds ``cache.stats()`` (prefetch
        precision and recall over actual transfers, hits, stall, ...).
        """
        self.cache.settle()
        st = dict(self._stats)
        st["plan_precision"] = (
            st["planned_and_needed"] / st["planned_experts"] if st["planned_experts"] else None
        )
        st["plan_recall"] = (
            st["planned_and_needed"] / st["needed_experts"] if st["needed_experts"] else None
        )
        st["mean_cleanup_token"] = st["cleanup_tokens"] / st["cleanups"] if st["cleanups"] else None
        st["bandwidth_bytes_per_s"] = self.planner.bandwidth
        st["draft_token_seconds"] = self.planner.token_seconds
        st["cache"] = self.cache.stats()
        return st
