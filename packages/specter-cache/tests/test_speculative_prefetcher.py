"""SpeculativePrefetcher: the observer protocol driving counter, planner and cache on the CPU."""

import inspect
import random

import pytest
import torch

from cache_helpers import CUDA_LAYOUT, build_store, cuda
from specter_cache import (
    ExpertCache,
    ExpertLayout,
    PlannerConfig,
    PrefetchPlanner,
    RoutingCounter,
    SpeculativePrefetcher,
)
from specter_cache.prefetch_planner import PlannerPhase

LAYOUT = ExpertLayout({"w": ((4, 4), torch.float32)})


def make(make_store, layers=2, experts=8, slots=3, chunk=2, pipelined=None):
    store, _ = make_store(layers, experts, LAYOUT)
    cache = ExpertCache(store, slots_per_layer=slots, device="cpu", policy="predictive")
    counter = RoutingCounter(layers, experts, "cpu")
    # Fixed chunk length: boundaries do not depend on measured (wall-clock) draft time.
    planner = PrefetchPlanner(PlannerConfig(initial_chunk=chunk, min_chunk=chunk, max_chunk=chunk))
    return cache, counter, SpeculativePrefetcher(cache, counter, planner, pipelined=pipelined)


def draft_token(prefetcher, index, routing):
    """One draft forward: each MoE layer reports its top-k ids, then the token is announced."""
    for layer, ids in routing.items():
        prefetcher.counter.observe(layer, torch.tensor(ids))
    prefetcher.on_draft_token(index)


def verify(cache, needed):
    for layer, experts in needed.items():
        for wave in cache.acquire(layer, experts):
            wave.release()


def test_three_phases_over_one_draft(make_store):
    cache, counter, pf = make(make_store)
    pf.on_draft_start(8)
    assert pf.planner.phase is PlannerPhase.COLD_START
    draft_token(pf, 0, {0: [0, 1], 1: [2]})
    assert cache.stats()["total"]["prefetch_loads"] == 0  # cold start: observe only
    draft_token(pf, 1, {0: [0], 1: [2, 3]})
    # Boundary at 2 tokens: plans {0: [0, 1], 1: [2, 3]} go out as the first batch.
    assert pf.planner.phase is PlannerPhase.PREFETCH_OVERLAP
    assert sorted(cache.resident_experts(0)) == [0, 1]
    assert sorted(cache.resident_experts(1)) == [2, 3]
    assert pf.planner.next_boundary == 4
    draft_token(pf, 2, {0: [5], 1: [6]})
    draft_token(pf, 3, {0: [0], 1: [2]})
    # Boundary at 4: the batch (5 and 6) fills the remaining slots: final cleanup.
    assert pf.planner.phase is PlannerPhase.FINAL_CLEANUP
    assert sorted(cache.resident_experts(0)) == [0, 1, 5]
    assert sorted(cache.resident_experts(1)) == [2, 3, 6]
    assert int(counter.counts.sum()) == 0  # counters cleared
    for i in range(4, 8):
        draft_token(pf, i, {0: [7], 1: [7]})  # no more prediction
    assert cache.stats()["total"]["prefetch_loads"] == 6
    pf.on_verify_start(9)
    assert int(counter.counts.sum()) == 0
    verify(cache, {0: [0, 5, 7], 1: [2, 3]})
    pf.on_verify_end(5)
    st = pf.stats()
    assert (st["boundaries"], st["cleanups"], st["cleanup_tokens"]) == (2, 1, 4)
    assert st["plan_precision"] == pytest.approx(4 / 6)  # planned {0,1,5}, {2,3,6}
    assert st["plan_recall"] == pytest.approx(4 / 5)  # needed {0,5,7}, {2,3}
    total = st["cache"]["total"]
    assert (total["prefetch_used"], total["prefetch_wasted"], total["misses"]) == (4, 2, 1)
    assert total["prefetch_precision"] == pytest.approx(4 / 6)
    assert total["prefetch_recall"] == pytest.approx(4 / 5)


def test_a_draft_that_stops_early_gets_a_final_snapshot_at_verify_start(make_store):
    cache, counter, pf = make(make_store)
    pf.on_draft_start(6)
    draft_token(pf, 0, {0: [1]})
    draft_token(pf, 1, {0: [1]})  # boundary: expert 1 of layer 0
    draft_token(pf, 2, {0: [4], 1: [5]})  # observed, but the next boundary (4) never comes
    assert cache.slot_of(0, 4) == -1
    pf.on_verify_start(4)
    assert cache.slot_of(0, 4) >= 0
    assert cache.slot_of(1, 5) >= 0
    assert pf.planner.phase is PlannerPhase.IDLE
    assert int(counter.counts.sum()) == 0


def test_depth_zero_iterations_prefetch_nothing(make_store):
    cache, _, pf = make(make_store)
    pf.on_draft_start(0)
    pf.on_verify_start(1)
    verify(cache, {0: [3]})
    pf.on_verify_end(0)
    total = cache.stats()["total"]
    assert (total["prefetch_loads"], total["misses"]) == (0, 1)
    assert pf.stats()["boundaries"] == 0


def test_protocol_misuse_is_reported(make_store):
    cache, counter, pf = make(make_store)
    with pytest.raises(RuntimeError, match="on_draft_start"):
        pf.on_draft_token(0)
    pf.on_draft_start(4)
    with pytest.raises(ValueError, match="expected 0"):
        pf.on_draft_token(1)
    with pytest.raises(ValueError, match="num_tokens"):
        pf.on_verify_start(0)
    with pytest.raises(ValueError, match="num_accepted"):
        pf.on_verify_end(-1)
    with pytest.raises(ValueError, match="depth"):
        pf.on_draft_start(-2)
    with pytest.raises(ValueError, match="RoutingCounter is"):
        SpeculativePrefetcher(cache, RoutingCounter(3, 8, "cpu"))
    with pytest.raises(ValueError, match="top_m"):
        SpeculativePrefetcher(cache, counter, top_m=[1])


def test_warm_up_takes_one_snapshot_and_changes_nothing(make_store, monkeypatch):
    cache, counter, pf = make(make_store)
    counter.observe(0, torch.tensor([1, 1, 4]))
    counts = counter.counts.clone()
    taken = []
    snapshot = counter.snapshot_async
    monkeypatch.setattr(
        counter, "snapshot_async", lambda top_m: taken.append(top_m) or snapshot(top_m)
    )
    pf.warm_up()
    assert taken == [pf.top_m]  # the planning snapshot's own call: the same buffer and kernels
    assert torch.equal(counter.counts, counts)
    assert pf.stats()["boundaries"] == 0
    assert pf.stats()["drafts"] == 0
    assert cache.stats()["total"]["prefetch_loads"] == 0
    # A draft after the warm-up plans as one without it.
    pf.on_draft_start(4)
    with pytest.raises(RuntimeError, match="during a draft"):
        pf.warm_up()
    draft_token(pf, 0, {0: [0, 1], 1: [2]})
    draft_token(pf, 1, {0: [0], 1: [2, 3]})
    assert sorted(cache.resident_experts(1)) == [2, 3]


def test_observer_protocol_signatures():
    # specter-spec calls these by duck typing with these argument names.
    expected = {
        "on_draft_start": ["depth"],
        "on_draft_token": ["index"],
        "on_verify_start": ["num_tokens"],
        "on_verify_end": ["num_accepted"],
    }
    for name, params in expected.items():
        sig = inspect.signature(getattr(SpeculativePrefetcher, name))
        assert list(sig.parameters)[1:] == params, name


def test_many_iterations_keep_the_books_balanced(make_store):
    cache, _, pf = make(make_store, layers=3, experts=10, slots=4, chunk=3)
    rng = random.Random(5)
    for _ in range(12):
        depth = rng.choice([0, 2, 5, 8])
        # The target's routing for the K + 1 rows; the draft agrees most of the time.
        target = [{layer: rng.sample(range(10), 2) for layer in range(3)} for _ in range(depth + 1)]
        pf.on_draft_start(depth)
        for i in range(depth):
            draft = {
                layer: ids if rng.random() < 0.8 else rng.sample(range(10), 2)
                for layer, ids in target[i + 1].items()
            }
            draft_token(pf, i, draft)
        pf.on_verify_start(depth + 1)
        needed = {layer: sorted({e for row in target for e in row[layer]}) for layer in range(3)}
        verify(cache, needed)
        pf.on_verify_end(rng.randint(0, depth))
        total = cache.stats()["total"]
        assert total["prefetch_used"] + total["prefetch_wasted"] == total["prefetch_loads"]
        for layer in range(3):
            assert all(s.protected == 0 for s in cache.slot_states(layer))
    st = pf.stats()
    assert st["verifications"] == 12
    assert st["plan_recall"] is None or 0 <= st["plan_recall"] <= 1
    assert st["cache"]["total"]["hits"] > 0


def test_pipelined_boundaries_read_their_snapshot_one_draft_token_later(make_store):
    # The same draft as test_three_phases_over_one_draft: same plans and books, each batch
    # issued at the draft token after its boundary (the host never waits for the draft
    # forward it has just queued).
    cache, counter, pf = make(make_store, pipelined=True)
    assert pf.pipelined
    assert not SpeculativePrefetcher(cache, counter).pipelined
    pf.on_draft_start(8)
    draft_token(pf, 0, {0: [0, 1], 1: [2]})
    draft_token(pf, 1, {0: [0], 1: [2, 3]})  # boundary at 2: snapshot queued, not read
    assert cache.stats()["total"]["prefetch_loads"] == 0
    # Token 2's routing lands after the snapshot was taken: 5 and 6 are not in this batch.
    draft_token(pf, 2, {0: [5], 1: [6]})
    assert sorted(cache.resident_experts(0)) == [0, 1]
    assert sorted(cache.resident_experts(1)) == [2, 3]
    assert pf.planner.next_boundary == 4  # decided from the boundary's token count (2)
    draft_token(pf, 3, {0: [0], 1: [2]})  # boundary at 4: queued
    assert pf.planner.phase is PlannerPhase.PREFETCH_OVERLAP
    draft_token(pf, 4, {0: [7], 1: [7]})  # read: 5 and 6 fill the slots: final cleanup
    assert pf.planner.phase is PlannerPhase.FINAL_CLEANUP
    assert sorted(cache.resident_experts(0)) == [0, 1, 5]
    assert sorted(cache.resident_experts(1)) == [2, 3, 6]
    for i in range(5, 8):
        draft_token(pf, i, {0: [7], 1: [7]})
    pf.on_verify_start(9)
    verify(cache, {0: [0, 5, 7], 1: [2, 3]})
    pf.on_verify_end(5)
    st = pf.stats()
    assert (st["boundaries"], st["cleanups"], st["cleanup_tokens"]) == (2, 1, 4)
    assert st["plan_precision"] == pytest.approx(4 / 6)
    assert st["plan_recall"] == pytest.approx(4 / 5)


def test_pipelined_snapshot_pending_at_verify_start_is_the_final_boundary(make_store):
    cache, _, pf = make(make_store, pipelined=True)
    pf.on_draft_start(2)
    draft_token(pf, 0, {0: [1]})
    draft_token(pf, 1, {1: [4]})  # boundary at the draft's last token: queued
    assert cache.slot_of(0, 1) == -1
    pf.on_verify_start(3)
    assert cache.slot_of(0, 1) >= 0
    assert cache.slot_of(1, 4) >= 0
    st = pf.stats()
    assert (st["boundaries"], st["cleanups"]) == (1, 1)  # one snapshot, not a second one
    assert pf.planner.phase is PlannerPhase.IDLE


@pytest.mark.parametrize("pipelined", [False, True])
def test_no_snapshot_once_every_expert_is_resident(make_store, monkeypatch, pipelined):
    store, _ = make_store(2, 4, LAYOUT)
    cache = ExpertCache(store, slots_per_layer=4, device="cpu", policy="lru")
    counter = RoutingCounter(2, 4, "cpu")
    pf = SpeculativePrefetcher(cache, counter, pipelined=pipelined)
    pf.on_draft_start(4)
    for i in range(4):
        draft_token(pf, i, {0: [i], 1: [3 - i]})
    pf.on_verify_start(5)
    verify(cache, {0: [0, 1, 2, 3], 1: [0, 1, 2, 3]})
    pf.on_verify_end(4)
    assert pf.stats()["boundaries"] > 0  # not yet resident: the draft planned loads
    assert all(cache.all_resident(layer) for layer in range(2))

    def refuse(*_args, **_kwargs):
        raise AssertionError("a snapshot was taken with every expert resident")

    monkeypatch.setattr(counter, "snapshot_async", refuse)
    before = pf.stats()["boundaries"]
    pf.on_draft_start(4)
    for i in range(4):
        draft_token(pf, i, {0: [i], 1: [i]})
    pf.on_verify_start(5)
    pf.on_verify_end(4)
    assert pf.stats()["boundaries"] == before


def test_pinned_slots_are_not_room_for_prefetches(make_store):
    # 4 slots per layer, 2 of them pinned (a hot set): 2 evictable slots per layer.
    cache, _, pf = make(make_store, slots=4)
    for layer in (0, 1):
        cache.pin(layer, [6, 7])
    cache.synchronize()
    pf.on_draft_start(8)
    draft_token(pf, 0, {0: [0, 6], 1: [2, 7]})  # the pinned experts are planned too
    draft_token(pf, 1, {0: [1, 6], 1: [3, 7]})
    # Plan {0: [6, 0, 1], 1: [7, 2, 3]}: 4 new experts fill the 4 evictable slots, so the
    # first boundary is the final cleanup (counting the pinned slots, 8 would look free).
    assert pf.planner.phase is PlannerPhase.FINAL_CLEANUP
    assert sorted(cache.resident_experts(0)) == [0, 1, 6, 7]
    assert sorted(cache.resident_experts(1)) == [2, 3, 6, 7]
    for i in range(2, 8):
        draft_token(pf, i, {0: [5], 1: [5]})
    pf.on_verify_start(9)
    verify(cache, {0: [0, 6], 1: [3, 7]})
    pf.on_verify_end(4)
    assert (pf.stats()["boundaries"], pf.stats()["cleanups"]) == (1, 1)


def test_plain_steps_may_overlap_only_once_every_expert_is_resident(make_store):
    store, _ = make_store(2, 4, LAYOUT)
    cache = ExpertCache(store, slots_per_layer=4, device="cpu", policy="lru")
    pf = SpeculativePrefetcher(cache, RoutingCounter(2, 4, "cpu"))
    assert not pf.plain_steps_may_overlap()  # slots for all, but nothing loaded yet
    verify(cache, {0: [0, 1, 2, 3]})
    assert not pf.plain_steps_may_overlap()  # layer 1 still loads on demand
    verify(cache, {1: [0, 1, 2, 3]})
    assert pf.plain_steps_may_overlap()
    _, _, budgeted = make(make_store, slots=3)  # a budget below the expert count
    verify(budgeted.cache, {0: [0, 1, 2], 1: [0, 1, 2]})
    assert not budgeted.plain_steps_may_overlap()


def _iterations(pf, cache, seed, watch=None, launched=None):
    """Twelve random draft/verify iterations on a 3-layer, 10-expert cache; ``watch`` is
    called after each ``on_verify_end``, ``launched`` where a verification would launch.
    Returns the prefetcher's stats (timings dropped)."""
    rng = random.Random(seed)
    for _ in range(12):
        depth = rng.choice([0, 1, 3, 6])
        target = [{layer: rng.sample(range(10), 2) for layer in range(3)} for _ in range(depth + 1)]
        pf.on_draft_start(depth)
        for i in range(depth):
            draft = {
                layer: ids if rng.random() < 0.8 else rng.sample(range(10), 2)
                for layer, ids in target[i + 1].items()
            }
            draft_token(pf, i, draft)
        pf.on_verify_start(depth + 1)
        if launched is not None:
            launched()
        for layer in range(3):  # a streamed verification: its counts come after the forward
            needed = sorted({e for row in target for e in row[layer]})
            streamed = cache.lookup(layer, needed)[1]
            cache.streamed.record_streamed(layer, needed, streamed)
        pf.on_verify_end(rng.randint(0, depth))
        if watch is not None:
            watch()
    st = pf.stats()
    for timing in ("bandwidth_bytes_per_s", "draft_token_seconds"):
        st.pop(timing)
    return st


def test_a_deferred_close_keeps_every_count_and_waits_for_the_next_draft(make_store):
    results = []
    for deferred in (False, True):
        cache, _, pf = make(make_store, layers=3, experts=10, slots=4, chunk=2)
        pf.deferred_close = deferred
        pending: list[int] = []

        def watch(cache=cache, pending=pending):
            pending.append(cache.counts_pending)

        results.append(_iterations(pf, cache, 3, watch))
        assert pending == ([1] * 12 if deferred else [0] * 12)  # closed at the next call
    assert results[1] == results[0]  # plan scores, accepted tokens and the cache's counters
    assert results[0]["verifications"] == 12
    assert results[0]["accepted_tokens"] > 0
    assert results[0]["cache"]["total"]["prefetch_wasted"] > 0  # expiry is part of the close


def test_deferred_close_is_on_by_default_only_on_cuda(make_store):
    _, _, pf = make(make_store)
    assert pf.deferred_close is False  # CPU counters: the close runs in on_verify_end


def test_verify_lead_holds_the_verifications_late_copies_and_keeps_every_count(make_store):
    results = []
    for lead in (None, 0, 1):
        # Pipelined, as on CUDA: the draft's last snapshot is planned at verification start.
        cache, _, pf = make(make_store, layers=3, experts=10, slots=4, chunk=2, pipelined=True)
        cache.streaming = True
        pf.verify_lead = lead
        held: list[int] = []

        def launched(cache=cache, held=held):  # what the streamed target does at its launch
            held.append(cache.copies_held)
            cache.release_copies()

        results.append((_iterations(pf, cache, 5, launched=launched), held))
    (base, none_held), (zero, zero_held), (one, one_held) = results
    assert base == zero == one  # plans, prefetches and counters: held copies are only late
    assert set(none_held) == {0}
    assert sum(zero_held) > 0
    assert [max(0, n - 1) for n in zero_held] == one_held  # one load goes out at once


@pytest.mark.parametrize("lead", [-2, 0.5, False])
def test_verify_lead_must_be_none_or_a_count(make_store, lead):
    store, _ = make_store(1, 4, LAYOUT)
    cache = ExpertCache(store, slots_per_layer=2, device="cpu")
    with pytest.raises(ValueError, match=rf"verify_lead must be None .* got {lead!r}"):
        SpeculativePrefetcher(cache, RoutingCounter(1, 4, "cpu"), verify_lead=lead)


def make_pair(make_store, layers=3, experts=10, slots=5):
    """Two identical caches and prefetchers: one plans the final boundary from a snapshot,
    the other layer by layer from published counts."""
    made = []
    for layerwise in (False, True):
        store, _ = make_store(layers, experts, LAYOUT)
        cache = ExpertCache(store, slots_per_layer=slots, device="cpu", policy="predictive")
        counter = RoutingCounter(layers, experts, "cpu")
        if layerwise:
            counter.publish()
        made.append(SpeculativePrefetcher(cache, counter, layerwise=layerwise))
    return made


def spy_prefetches(monkeypatch, cache):
    """Record every plan ``cache.prefetch`` receives."""
    plans = []
    original = cache.prefetch

    def spy(plan, **kwargs):
        plans.append({layer: list(experts) for layer, experts in plan.items()})
        return original(plan, **kwargs)

    monkeypatch.setattr(cache, "prefetch", spy)
    return plans


def test_layerwise_final_plans_what_the_final_snapshot_plans(make_store, monkeypatch):
    # 7 slots: every draft's experts (at most 6 a layer) make the plan, so ties between
    # equal counts (ranked by id here, by the device's top-k in a snapshot) cut nothing.
    snap, layered = make_pair(make_store, slots=7)
    snap_plans = spy_prefetches(monkeypatch, snap.cache)
    layered_plans = spy_prefetches(monkeypatch, layered.cache)
    rng = random.Random(3)
    for _ in range(10):
        depth = rng.choice([1, 2, 3])
        drafts = [{layer: rng.sample(range(10), 2) for layer in range(3)} for _ in range(depth)]
        needed = {layer: rng.sample(range(10), 3) for layer in range(3)}
        accepted = rng.randint(0, depth)
        for pf in (snap, layered):
            start = len(snap_plans if pf is snap else layered_plans)
            pf.on_draft_start(depth)
            for i, routing in enumerate(drafts):
                draft_token(pf, i, routing)
            pf.on_verify_start(depth + 1)
            verify(pf.cache, needed)
            pf.on_verify_end(accepted)
        # The final plan is issued before the verification either way; by layers in order
        # when layer-wise (here every row is there at once: one batch).
        final_snap = {}
        for plan in snap_plans[start:]:
            final_snap.update(plan)
        final_layered = {}
        for plan in layered_plans[start:]:
            final_layered.update(plan)
        assert final_layered.keys() == final_snap.keys()
        counts = [
            {e: sum(d[layer].count(e) for d in drafts) for e in range(10)} for layer in range(3)
        ]
        for layer, experts in final_layered.items():
            assert sorted(experts) == sorted(final_snap[layer])
            assert experts == sorted(experts, key=lambda e, c=counts[layer]: (-c[e], e))
    st_snap, st_layered = snap.stats(), layered.stats()
    for key in ("boundaries", "cleanups", "planned_experts", "needed_experts", "verifications"):
        assert st_layered[key] == st_snap[key], key
    # Each draft still predicting at its last token ends in a layer-wise boundary.
    assert 0 < st_layered["layerwise_boundaries"] <= st_layered["cleanups"]
    assert st_layered["layerwise_fallbacks"] == 0
    assert st_snap["layerwise_boundaries"] == 0


class ForwardRunning:
    """A marker of a forward still running until ``done`` is set."""

    def __init__(self):
        self.done = False

    def query(self):
        return self.done

    def elapsed_seconds(self, end):
        return 1e-3


def test_layerwise_rows_arriving_late_are_planned_in_runs_as_they_come(make_store, monkeypatch):
    _, pf = make_pair(make_store, layers=4)
    plans = spy_prefetches(monkeypatch, pf.cache)
    counter = pf.counter
    published = counter.published
    polls = {"n": 0}
    marker = ForwardRunning()

    def arriving(layer, generation):
        # The device reaches one more layer every third poll, and is done after the last.
        polls["n"] += 1
        marker.done = polls["n"] // 3 >= 4
        return published(layer, generation) if layer < polls["n"] // 3 else None

    monkeypatch.setattr(counter, "published", arriving)
    monkeypatch.setattr(pf.cache.copy_engine, "record_compute", lambda timing=False: marker)
    pf.on_draft_start(1)
    draft_token(pf, 0, {0: [1, 2], 1: [3, 4], 2: [5, 6], 3: [7, 8]})
    assert [sorted(plan) for plan in plans] == [[0], [1], [2], [3]]
    assert [sorted(e for p in plans for e in p.get(layer, [])) for layer in range(4)] == [
        [1, 2],
        [3, 4],
        [5, 6],
        [7, 8],
    ]
    assert all(pf.cache.slot_of(3, e) >= 0 for e in (7, 8))  # issued before verify_start
    pf.on_verify_start(2)
    assert len(plans) == 4  # nothing left to plan at verification start
    st = pf.stats()
    assert (st["layerwise_batches"], st["layerwise_fallbacks"], st["boundaries"]) == (4, 0, 1)


def test_layerwise_falls_back_to_a_snapshot_for_rows_that_never_arrive(make_store, monkeypatch):
    _, pf = make_pair(make_store)
    plans = spy_prefetches(monkeypatch, pf.cache)
    published = pf.counter.published
    # Layer 1's row never comes (as from a draft graph captured before publish()); the
    # forward's marker is done (CPU), so the host does not wait for it.
    monkeypatch.setattr(
        pf.counter, "published", lambda layer, gen: None if layer == 1 else published(layer, gen)
    )
    pf.on_draft_start(1)
    draft_token(pf, 0, {0: [1, 2], 1: [3, 4], 2: [5, 6]})
    assert [sorted(plan) for plan in plans] == [[0], [1, 2]]
    assert (sorted(plans[1][1]), sorted(plans[1][2])) == ([3, 4], [5, 6])
    st = pf.stats()
    assert (st["layerwise_fallbacks"], st["layerwise_boundaries"], st["boundaries"]) == (1, 1, 1)


def test_layerwise_needs_a_publishing_counter_and_stamps_only_the_last_forward(
    make_store, monkeypatch
):
    store, _ = make_store(2, 8, LAYOUT)
    cache = ExpertCache(store, slots_per_layer=3, device="cpu", policy="predictive")
    counter = RoutingCounter(2, 8, "cpu")
    pf = SpeculativePrefetcher(cache, counter, layerwise=True)
    pf.on_draft_start(2)
    draft_token(pf, 0, {0: [1]})
    draft_token(pf, 1, {0: [2]})
    pf.on_verify_start(3)
    assert pf.stats()["layerwise_boundaries"] == 0  # no published rows: snapshots
    counter.publish()
    stamps = []
    begin = counter.begin_forward
    monkeypatch.setattr(
        counter, "begin_forward", lambda: stamps.append(counter.observations) or begin()
    )
    pf.on_draft_start(3)
    for i in range(3):
        draft_token(pf, i, {0: [i], 1: [i + 1]})
    pf.on_verify_start(4)
    assert stamps == [4]  # once, after the second forward's two observes: before the third
    assert pf.stats()["layerwise_boundaries"] == 1


@cuda
def test_prefetcher_on_cuda_prefetches_from_device_counters():
    store, _ = build_store(2, 8, CUDA_LAYOUT, seed=5)
    cache = ExpertCache(store, slots_per_layer=3, device="cuda", policy="predictive")
    counter = RoutingCounter(2, 8, "cuda")
    planner = PrefetchPlanner(PlannerConfig(initial_chunk=2))
    pf = SpeculativePrefetcher(cache, counter, planner)
    pf.on_draft_start(6)
    for i in range(6):
        for layer in range(2):
            counter.observe(layer, torch.tensor([[1, 2 + layer]], device="cuda"))
        torch.cuda.synchronize()  # the timing markers are complete when a boundary reads them
        pf.on_draft_token(i)
    pf.on_verify_start(7)
    for layer in range(2):
        for wave in cache.acquire(layer, [1, 2 + layer]):
            wave.release()
    pf.on_verify_end(6)
    st = pf.stats()
    assert st["plan_recall"] == 1.0
    assert st["cache"]["total"]["misses"] == 0
    assert st["draft_token_seconds"] is not None
    assert st["bandwidth_bytes_per_s"] > 0


@cuda
def test_warm_up_on_cuda_leaves_the_counts_and_the_first_plan_as_they_were():
    store, _ = build_store(2, 8, CUDA_LAYOUT, seed=6)
    cache = ExpertCache(store, slots_per_layer=3, device="cuda", policy="predictive")
    counter = RoutingCounter(2, 8, "cuda")
    pf = SpeculativePrefetcher(cache, counter, PrefetchPlanner(PlannerConfig(initial_chunk=2)))
    counter.observe(0, torch.tensor([[4, 4]], device="cuda"))
    before = counter.counts.clone()
    pf.warm_up()
    assert torch.equal(counter.counts, before)
    assert cache.stats()["total"]["prefetch_loads"] == 0
    pf.on_draft_start(2)
    for i in range(2):
        counter.observe(1, torch.tensor([[5, 6]], device="cuda"))
        torch.cuda.synchronize()
        pf.on_draft_token(i)
    pf.on_verify_start(3)
    cache.synchronize()
    assert sorted(cache.resident_experts(1)) == [5, 6]
