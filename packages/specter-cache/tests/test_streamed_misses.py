"""The cache's side of the streamed miss path: host tensors, counting, and map safety."""

import pytest
import torch

from specter_cache import ExpertCache
from specter_cache.copy_engine import DeferredCopyEngine


def test_host_tensors_are_the_stores_views(make_store):
    store, ref = make_store(2, 5)
    cache = ExpertCache(store, slots_per_layer=2, device="cpu")
    tensors = cache.streamed.host_tensors(1, "down")
    assert len(tensors) == 5
    for e, t in enumerate(tensors):
        assert t.data_ptr() == store.get(1, e)["down"].data_ptr()  # in place: no copy
        assert torch.equal(t, ref[(1, e)]["down"])
    with pytest.raises(ValueError, match=r"tensors \['gate_up', 'down'\], not 'w'"):
        cache.streamed.host_tensors(0, "w")


def test_record_streamed_counts_hits_streamed_misses_and_bytes(make_store):
    store, _ = make_store(1, 8)
    cache = ExpertCache(store, slots_per_layer=3, device="cpu")
    cache.prefetch({0: [1, 2]})
    cache.streamed.record_streamed(0, [1, 5, 6], [5, 6])
    total = cache.stats()["total"]
    nbytes = store.expert_bytes(0)
    assert (total["hits"], total["misses"], total["acquires"]) == (1, 2, 1)
    assert total["streamed_reads"] == 2
    assert total["streamed_bytes"] == 2 * nbytes
    assert total["bytes_moved"] == 4 * nbytes  # two prefetched, two streamed
    assert total["demand_loads"] == 0  # nothing was loaded for the verification
    assert total["prefetch_used"] == 1  # expert 1; expert 2 is still pending
    assert cache.take_needed() == {0: {1, 5, 6}}
    assert cache.expire_prefetches() == 1
    assert cache.lookup(0, [1, 2, 5, 6]) == ([1, 2], [5, 6])  # streamed experts stay out
    with pytest.raises(ValueError, match=r"streamed experts \[7\] must be among the needed"):
        cache.streamed.record_streamed(0, [1], [7])


def test_the_streamed_histogram_bins_layer_verifications_by_experts_read(make_store):
    store, _ = make_store(2, 8)
    cache = ExpertCache(store, slots_per_layer=3, device="cpu")
    cache.prefetch({0: [1], 1: [1]})
    cache.streamed.record_streamed(0, [1, 5, 6], [5, 6])
    cache.streamed.record_streamed(1, [1, 2, 3, 4], [2, 3, 4])
    cache.streamed.record_streamed(0, [1], [])  # read nothing from the host: the zero bin
    cache.streamed.record_streamed(1, [5, 7], [5, 7])
    stats = cache.stats()
    assert stats["per_layer"][0]["streamed_histogram"] == {0: 1, 2: 1}
    assert stats["per_layer"][1]["streamed_histogram"] == {2: 1, 3: 1}
    assert stats["total"]["streamed_histogram"] == {0: 1, 2: 2, 3: 1}  # bins in order
    assert list(stats["total"]["streamed_histogram"]) == [0, 2, 3]
    assert (
        sum(n * c for n, c in stats["total"]["streamed_histogram"].items())
        == (stats["total"]["streamed_reads"])
    )
    cache.reset_stats()
    assert cache.stats()["total"]["streamed_histogram"] == {}


def test_record_streamed_refreshes_lru_recency(make_store):
    store, _ = make_store(1, 6)
    cache = ExpertCache(store, slots_per_layer=2, device="cpu", policy="lru")
    cache.prefetch({0: [0]})
    cache.prefetch({0: [1]})
    cache.streamed.record_streamed(0, [0, 4], [4])  # expert 0 used now: expert 1 is the LRU victim
    cache.prefetch({0: [3]})
    assert sorted(cache.resident_experts(0)) == [0, 3]


@pytest.mark.parametrize("streaming", [False, True])
def test_a_streaming_load_takes_the_old_expert_off_the_map_first(make_store, streaming):
    # Deferred copies run in issue order: the invalidation is the load's first copy, so a
    # reader of the map never sees the old expert once its slot starts changing.
    store, ref = make_store(1, 4)
    engine = DeferredCopyEngine("cpu")
    cache = ExpertCache(store, slots_per_layer=1, device="cpu", copy_engine=engine)
    cache.streaming = streaming
    assert cache.streaming is streaming
    cache.prefetch({0: [2]})
    engine.synchronize()
    cache.streamed.mark_streamed_use()
    cache.prefetch({0: [3]})
    engine.step(1)
    assert cache.expert_to_slot(0).tolist() == [-1, -1, -1, -1]
    assert torch.equal(cache.slot_tensors(0)["down"][0], ref[(0, 2)]["down"])  # not yet
    engine.synchronize()
    assert cache.expert_to_slot(0).tolist() == [-1, -1, -1, 0]
    assert torch.equal(cache.slot_tensors(0)["down"][0], ref[(0, 3)]["down"])
    cache.streamed.stream_guard()  # CPU engines: nothing to wait for


def test_a_streaming_prefetch_invalidates_every_evicted_expert_before_any_data_copy(make_store):
    # One prefetch of two layers that evicts three experts: on the streamed path the batch
    # takes all three off the maps first, then copies the data, each loaded expert's map
    # entry after its own data; the slots of a layer share one readiness event, complete
    # after the layer's last copy.
    store, ref = make_store(2, 6)
    engine = DeferredCopyEngine("cpu")
    cache = ExpertCache(store, slots_per_layer=2, device="cpu", copy_engine=engine)
    cache.prefetch({0: [0, 1], 1: [0]})
    engine.synchronize()
    cache.streaming = True
    per_load = len(store.layout(0).names) + 1  # the data copies and the map entry
    issued = cache.prefetch({0: [4, 5], 1: [3, 2]})
    assert issued == {0: [4, 5], 1: [3, 2]}  # layer 1's empty slot and its one victim
    assert engine.pending == 3 + 4 * per_load  # experts 0, 1 of layer 0 and 0 of layer 1
    engine.step(3)
    assert cache.expert_to_slot(0)[[0, 1]].tolist() == [-1, -1]
    assert cache.expert_to_slot(1)[0].item() == -1
    assert cache.expert_to_slot(0)[[4, 5]].tolist() == [-1, -1]  # no data copied yet
    engine.step(per_load - 1)  # expert 4's data, not yet its map entry
    slot4 = cache.slot_of(0, 4)
    assert torch.equal(cache.slot_tensors(0)["down"][slot4], ref[(0, 4)]["down"])
    assert cache.expert_to_slot(0)[4].item() == -1
    engine.step(1)
    assert cache.expert_to_slot(0)[4].item() == slot4
    ready = [cache._residency.pools[0].ready[s] for s in range(2)]
    assert ready[0] is ready[1]
    assert not ready[0].query()  # expert 5 is still to come
    engine.step(per_load)
    assert ready[0].query()
    assert not cache._residency.pools[1].ready[cache.slot_of(1, 3)].query()
    engine.synchronize()
    for layer, experts in ((0, [4, 5]), (1, [3, 2])):
        for e in experts:
            slot = cache.slot_of(layer, e)
            assert cache.expert_to_slot(layer)[e].item() == slot
            for name in store.layout(layer).names:
                assert torch.equal(cache.slot_tensors(layer)[name][slot], ref[(layer, e)][name])


# ----------------------------------------------------------------------- deferred counts
# Every method that reads or changes the cache's bookkeeping, with arguments valid on a
# 2-layer, 8-expert, 3-slot cache.
_SETTLING_CALLS = {
    "lookup": lambda c: c.lookup(0, [1]),
    "set_plan": lambda c: c.set_plan({0: [1]}),
    "prefetch": lambda c: c.prefetch({0: [4]}),
    "acquire": lambda c: c.acquire(0, [1]).close(),
    "pin": lambda c: c.pin(1, [2]),
    "unpin": lambda c: c.unpin(0, [1]),
    "prepare_fills": lambda c: c.streamed.prepare_fills(1),
    "stream_guard": lambda c: c.streamed.stream_guard(),
    "take_needed": lambda c: c.take_needed(),
    "expire_prefetches": lambda c: c.expire_prefetches(),
    "stats": lambda c: c.stats(),
    "reset_stats": lambda c: c.reset_stats(),
    "resident_experts": lambda c: c.resident_experts(0),
    "slot_of": lambda c: c.slot_of(0, 1),
    "slot_states": lambda c: c.slot_states(0),
    "streaming": lambda c: setattr(c, "streaming", True),
}


@pytest.mark.parametrize("name", sorted(_SETTLING_CALLS))
def test_a_queued_count_runs_before_any_method_that_reads_the_bookkeeping(make_store, name):
    store, _ = make_store(2, 8)
    cache = ExpertCache(store, slots_per_layer=3, device="cpu")
    cache.prefetch({0: [1]})
    seen: list[int] = []

    def count():  # what a deferred stream record does: record_streamed, late
        seen.append(len(seen))
        cache.streamed.record_streamed(0, [1, 5], [5])

    cache.count_later(count)
    cache.count_later(count)
    assert cache.counts_pending == 2  # queued: nothing counted yet
    assert seen == []
    _SETTLING_CALLS[name](cache)
    assert seen == [0, 1]  # both ran, oldest first, before the call returned
    assert cache.counts_pending == 0


def test_all_resident_settles_only_where_a_layer_has_a_slot_per_expert(make_store):
    # Under a budget the answer is False whatever the counts hold, so it runs none (a
    # pipelined streamed step asks before every launch); with a slot per expert it settles.
    store, _ = make_store(2, 4)
    for slots, pending_after in ((3, 1), (4, 0)):
        cache = ExpertCache(store, slots_per_layer=slots, device="cpu")
        cache.count_later(lambda: None)
        assert cache.all_resident(0) is False
        assert not cache.every_layer_resident()
        assert cache.counts_pending == pending_after


def test_deferred_counts_give_the_counts_made_at_once(make_store):
    results = []
    for deferred in (False, True):
        store, _ = make_store(2, 8)
        cache = ExpertCache(store, slots_per_layer=3, device="cpu", policy="lru")
        cache.prefetch({0: [1, 2], 1: [3]})
        calls = [(0, [1, 5], [5]), (1, [3, 4, 6], [4, 6]), (0, [2, 7], [7])]
        for layer, needed, streamed in calls:
            if deferred:
                cache.count_later(
                    lambda c=cache, a=(layer, needed, streamed): c.streamed.record_streamed(*a)
                )
            else:
                cache.streamed.record_streamed(layer, needed, streamed)
        # The next decision (a prefetch's victims follow the counts' recency) and reads.
        issued = cache.prefetch({0: [6, 0], 1: [0]})
        results.append((issued, cache.take_needed(), cache.expire_prefetches(), cache.stats()))
    assert results[0] == results[1]
    assert results[1][3]["total"]["streamed_reads"] == 4


def test_count_later_needs_a_callable(make_store):
    store, _ = make_store(1, 4)
    cache = ExpertCache(store, slots_per_layer=2, device="cpu")
    with pytest.raises(TypeError, match="count_later needs a callable, got int"):
        cache.count_later(3)  # type: ignore[arg-type]


# ------------------------------------------------------------------ held data copies (lead)
def _streaming_cache_with_victims(make_store):
    """A streamed 2-layer, 6-expert, 2-slot cache on deferred copies, full after a first
    prefetch, so the next loads evict."""
    store, ref = make_store(2, 6)
    engine = DeferredCopyEngine("cpu")
    cache = ExpertCache(store, slots_per_layer=2, device="cpu", copy_engine=engine)
    cache.prefetch({0: [0, 1], 1: [0, 1]})
    engine.synchronize()
    cache.streaming = True
    return store, ref, engine, cache


def test_a_prefetch_with_lead_issues_every_invalidation_and_holds_the_late_data(make_store):
    store, ref, engine, cache = _streaming_cache_with_victims(make_store)
    per_load = len(store.layout(0).names) + 1  # the data copies and the map entry
    issued = cache.prefetch({0: [4, 5], 1: [3]}, lead=1)
    assert issued == {0: [4, 5], 1: [3]}  # the host decided all three loads
    assert cache.copies_held == 2
    assert engine.pending == 3 + per_load  # three victims off the map, one load's data
    engine.synchronize()
    maps = [cache.expert_to_slot(layer).tolist() for layer in (0, 1)]
    evicted = [e for layer in (0, 1) for e in (0, 1) if maps[layer][e] == -1]
    assert len(evicted) == 3  # every victim is off its map before any held copy goes out
    assert maps[0][4] == cache.slot_of(0, 4)  # the lead load landed
    assert maps[0][5] == -1
    assert maps[1][3] == -1
    cache.streamed.stream_guard()  # the launch path does not release
    assert cache.copies_held == 2
    assert cache.release_copies() == 2
    assert cache.copies_held == 0
    assert cache.release_copies() == 0
    assert engine.pending == 2 * per_load
    engine.synchronize()
    for layer, e in ((0, 4), (0, 5), (1, 3)):
        slot = cache.slot_of(layer, e)
        assert cache.expert_to_slot(layer)[e].item() == slot
        for name in store.layout(layer).names:
            assert torch.equal(cache.slot_tensors(layer)[name][slot], ref[(layer, e)][name])
    assert len(cache.completed_transfers()) == 3  # the first batch, the lead, the held


def test_lead_zero_holds_every_data_copy_and_lead_is_ignored_off_the_streamed_path(make_store):
    _store, _, engine, cache = _streaming_cache_with_victims(make_store)
    cache.prefetch({0: [4]}, lead=0)
    assert cache.copies_held == 1
    assert engine.pending == 1  # the victim's invalidation only
    cache.release_copies()
    cache.streaming = False
    cache.prefetch({0: [5]}, lead=0)  # the acquire path copies everything at once
    assert cache.copies_held == 0


# Every method that issues copies or reads their readiness releases held copies first.
_RELEASING_CALLS = {
    "prefetch": lambda c: c.prefetch({1: [5]}),
    "acquire": lambda c: c.acquire(1, [0]).close(),
    "pin": lambda c: c.pin(1, [0]),
    "unpin": lambda c: c.unpin(1, [0]),
    "prepare_fills": lambda c: c.streamed.prepare_fills(1),
    "synchronize": lambda c: c.synchronize(),
    "completed_transfers": lambda c: c.completed_transfers(),
    "stats": lambda c: c.stats(),
    "reset_stats": lambda c: c.reset_stats(),
    "streaming": lambda c: setattr(c, "streaming", False),
}


@pytest.mark.parametrize("name", sorted(_RELEASING_CALLS))
def test_held_copies_go_out_before_any_method_that_issues_or_reads_copies(make_store, name):
    _, _, engine, cache = _streaming_cache_with_victims(make_store)
    cache.prefetch({0: [4, 5]}, lead=0)
    enqueued = engine.enqueued
    assert cache.copies_held == 2
    _RELEASING_CALLS[name](cache)
    assert cache.copies_held == 0
    assert engine.enqueued > enqueued
    engine.synchronize()
    assert cache.expert_to_slot(0)[[4, 5]].tolist() == [cache.slot_of(0, 4), cache.slot_of(0, 5)]


@pytest.mark.parametrize("name", ["lookup", "take_needed", "expire_prefetches", "slot_states"])
def test_host_side_reads_leave_held_copies_held(make_store, name):
    _, _, _, cache = _streaming_cache_with_victims(make_store)
    cache.prefetch({0: [4]}, lead=0)
    _SETTLING_CALLS[name](cache)
    cache.settle()
    assert cache.copies_held == 1
    assert cache.lookup(0, [4]) == ([4], [])  # decided on the host: resident for planning


@pytest.mark.parametrize("lead", [-1, 1.5, True, "2"])
def test_prefetch_rejects_a_bad_lead(make_store, lead):
    _, _, _, cache = _streaming_cache_with_victims(make_store)
    with pytest.raises(ValueError, match=rf"lead must be None .* got {lead!r}"):
        cache.prefetch({0: [4]}, lead=lead)


def test_wait_for_landing_runs_the_layers_loads_and_no_later_ones(make_store):
    # Deferred copies stand still until waited for: waiting for layer 0 lands its loads
    # (data and map entries) and leaves layer 1's queued; a layer with no new loads waits
    # for nothing.
    store, ref = make_store(2, 6)
    engine = DeferredCopyEngine("cpu")
    cache = ExpertCache(store, slots_per_layer=3, device="cpu", copy_engine=engine)
    cache.streaming = True
    cache.prefetch({0: [4, 5], 1: [2]})
    assert engine.pending > 0
    assert cache.expert_to_slot(0)[4] == -1  # still crossing
    cache.streamed.wait_for_landing(0)
    for e in (4, 5):
        slot = int(cache.expert_to_slot(0)[e])
        assert slot >= 0
        assert torch.equal(cache.slot_tensors(0)["down"][slot], ref[(0, e)]["down"])
    assert cache.expert_to_slot(1)[2] == -1  # layer 1's load was issued after: still queued
    left = engine.pending
    assert left > 0
    cache.streamed.wait_for_landing(0)  # nothing new for layer 0
    assert engine.pending == left
    cache.streamed.wait_for_landing(1)
    assert engine.pending == 0
    assert cache.expert_to_slot(1)[2] >= 0


def test_wait_for_landing_covers_later_batches_and_not_held_copies(make_store):
    store, _ = make_store(1, 8)
    engine = DeferredCopyEngine("cpu")
    cache = ExpertCache(store, slots_per_layer=4, device="cpu", copy_engine=engine)
    cache.streaming = True
    cache.prefetch({0: [1]})
    cache.prefetch({0: [2, 3]}, lead=1)  # expert 3's data copy is held
    cache.streamed.wait_for_landing(0)
    assert cache.expert_to_slot(0)[1] >= 0
    assert cache.expert_to_slot(0)[2] >= 0
    assert cache.expert_to_slot(0)[3] == -1  # held: not issued, so not waited for
    assert cache.copies_held == 1
    cache.release_copies()
    cache.streamed.wait_for_landing(0)
    assert cache.expert_to_slot(0)[3] >= 0
    with pytest.raises(ValueError, match=r"layer must be an int in \[0, 1\), got 1"):
        cache.streamed.wait_for_landing(1)


def test_wait_for_landing_is_free_where_copies_complete_at_once(make_store):
    store, _ = make_store(1, 4)
    cache = ExpertCache(store, slots_per_layer=2, device="cpu")  # immediate copies
    cache.streaming = True
    cache.prefetch({0: [3]})
    cache.streamed.wait_for_landing(0)
    assert cache.expert_to_slot(0)[3] >= 0
