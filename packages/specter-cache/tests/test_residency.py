"""Residency: eviction by the policy, the prefetch window, pins, residency answers and deferred
counts."""

import pytest
import torch

from cache_helpers import SETTLING_CALLS, assert_slots_hold, protected
from specter_cache import ExpertCache, ExpertLayout, LRUPolicy
from specter_cache.copy_engine import DeferredCopyEngine

LAYOUT = ExpertLayout({"gate_up": ((8, 4), torch.float32), "down": ((4, 4), torch.float32)})


def test_prefetch_precision_recall_and_bytes(make_store):
    store, _ = make_store(2, 8, LAYOUT)
    cache = ExpertCache(store, slots_per_layer=4, device="cpu")
    cache.prefetch({0: [1, 2, 3], 1: [4]})
    for _ in cache.acquire(0, [1, 2, 5]):
        pass
    for _ in cache.acquire(1, [4, 6, 7]):
        pass
    assert cache.expire_prefetches() == 1  # expert 3 of layer 0 was never used
    st = cache.stats()
    total = st["total"]
    assert total["prefetch_loads"] == 4
    assert total["prefetch_used"] == 3
    assert total["prefetch_wasted"] == 1
    assert total["prefetch_precision"] == pytest.approx(3 / 4)
    assert total["prefetch_recall"] == pytest.approx(3 / (3 + 3))  # misses 5, 6, 7
    assert total["bytes_moved"] == 7 * LAYOUT.payload_bytes
    assert st["per_layer"][0]["misses"] == 1
    assert st["per_layer"][1]["prefetch_precision"] == 1.0
    assert cache.take_needed() == {0: {1, 2, 5}, 1: {4, 6, 7}}
    assert cache.take_needed() == {}
    cache.reset_stats()
    assert cache.stats()["total"]["hits"] == 0


def test_evicting_an_unused_prefetch_counts_it_as_wasted(make_store):
    store, _ = make_store(1, 8, LAYOUT)
    cache = ExpertCache(store, slots_per_layer=2, device="cpu")
    cache.prefetch({0: [1, 2]})
    for _ in cache.acquire(0, [3, 4]):
        pass
    total = cache.stats()["total"]
    assert total["prefetch_wasted"] == 2
    assert total["evictions"] == 2


def test_predictive_policy_keeps_the_plan_under_pressure(make_store):
    store, _ = make_store(1, 8, LAYOUT)
    cache = ExpertCache(store, slots_per_layer=3, device="cpu", policy="predictive")
    cache.set_plan({0: [5, 6]})
    cache.prefetch({0: [5, 6]})
    for needed in ([1], [2], [3], [4]):
        for _ in cache.acquire(0, needed):
            pass
    assert sorted(cache.resident_experts(0)) == [4, 5, 6]


def test_a_policy_that_picks_a_non_candidate_is_caught(make_store):
    class Rogue(LRUPolicy):
        name = "rogue"

        def choose_victim(self, layer, candidates):
            return 99

    store, _ = make_store(1, 8, LAYOUT)
    cache = ExpertCache(store, slots_per_layer=1, device="cpu", policy=Rogue())
    cache.prefetch({0: [1]})
    with pytest.raises(RuntimeError, match="not one of the evictable candidates"):
        cache.prefetch({0: [2]})


def test_all_resident_needs_a_slot_per_expert_and_every_load_landed(make_store):
    store, _ = make_store(2, 4, LAYOUT)
    engine = DeferredCopyEngine()  # holds loads in flight until waited for
    cache = ExpertCache(store, slots_per_layer=[4, 3], device="cpu", copy_engine=engine)
    assert not cache.all_resident(0)  # empty slots
    cache.prefetch({0: [0, 1, 2, 3], 1: [0, 1, 2]})
    assert not cache.all_resident(0)  # every slot claimed, the copies still in flight
    cache.synchronize()
    assert cache.all_resident(0)
    assert not cache.all_resident(1)  # three slots for four experts: never
    with pytest.raises(ValueError, match="layer must be an int"):
        cache.all_resident(2)


def test_every_layer_resident_only_without_a_budget(make_store):
    store, _ = make_store(2, 4, LAYOUT)
    engine = DeferredCopyEngine()
    cache = ExpertCache(store, slots_per_layer=4, device="cpu", copy_engine=engine)
    cache.prefetch({0: [0, 1, 2, 3]})
    cache.synchronize()
    assert cache.all_resident(0)
    assert not cache.every_layer_resident()  # layer 1 is still empty
    cache.prefetch({1: [0, 1, 2, 3]})
    assert not cache.every_layer_resident()  # its copies are in flight
    cache.synchronize()
    assert cache.every_layer_resident()
    budget = ExpertCache(store, slots_per_layer=[4, 3], device="cpu")
    budget.prefetch({0: [0, 1, 2, 3], 1: [0, 1, 2]})
    budget.synchronize()
    assert not budget.every_layer_resident()


def test_pinned_experts_stay_resident_until_unpinned(make_store):
    store, _ = make_store(2, 8, LAYOUT)
    cache = ExpertCache(store, slots_per_layer=3, device="cpu", policy="lru")
    assert cache.pin(0, [5, 6]) == [5, 6]
    assert cache.pin(0, [6]) == []  # already pinned
    assert cache.pinned(0) == [5, 6]
    assert cache.pinned(1) == []
    assert_slots_hold(cache, store, 0, [5, 6])
    assert cache.stats()["total"]["prefetch_loads"] == 2
    assert cache.expire_prefetches() == 0  # pinned loads are never wasted prefetches
    for e in range(8):  # every other expert passes through the one evictable slot
        for wave in cache.acquire(0, [e]):
            wave.release()
    assert cache.resident_experts(0).count(5) == cache.resident_experts(0).count(6) == 1
    assert_slots_hold(cache, store, 0, [5, 6])
    with pytest.raises(ValueError, match="leaves none of its 3 slots evictable; pin at most 2"):
        cache.pin(0, [1])
    assert cache.unpin(0, [5, 7]) == [5]
    for e in (0, 1):  # unpinned, 5 is the least recently used evictable expert
        for wave in cache.acquire(0, [e]):
            wave.release()
    assert cache.slot_of(0, 5) == -1
    assert cache.slot_of(0, 6) >= 0
    assert max(protected(cache, 0)) == 1  # 6's pin, nothing leaked


def test_pin_refuses_bad_ids_and_full_layers_may_pin_everything(make_store):
    store, _ = make_store(1, 4, LAYOUT)
    cache = ExpertCache(store, slots_per_layer=4, device="cpu")
    assert cache.pin(0, range(4)) == [0, 1, 2, 3]  # a slot per expert: nothing must load later
    with pytest.raises(ValueError, match="pin"):
        cache.pin(0, [9])


@pytest.mark.parametrize("name", sorted(SETTLING_CALLS))
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
    SETTLING_CALLS[name](cache)
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
