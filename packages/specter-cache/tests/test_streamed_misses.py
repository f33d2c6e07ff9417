"""The streamed-miss protocol (``cache.streamed``): host tensors, counting streamed forwards,
landing waits, fill candidates and their adoption."""

import pytest
import torch

from cache_helpers import CUDA_LAYOUT, SLEEP_CYCLES, build_store, cuda
from specter_cache import ExpertCache
from specter_cache.copy_engine import DeferredCopyEngine


def fill_like_the_kernels(cache, ref, layer, fills, candidates):
    """What ``assign_fill_slots`` and the grouped kernel do on a fill: the evicted
    candidates' experts off the device map, the streamed experts' tensors into their slots."""
    mapping = cache.expert_to_slot(layer)
    for e, s in fills.items():
        if candidates[s] >= 0:
            mapping[candidates[s]] = -1
        for name, t in cache.slot_tensors(layer).items():
            t[s].copy_(ref[(layer, e)][name])


def candidates_of(slots, experts, layer):
    return {
        int(s): int(e)
        for s, e in zip(slots[layer].tolist(), experts[layer].tolist(), strict=True)
        if s >= 0
    }


def fills_tensor(cache, per_layer):
    fills = torch.full((cache.num_layers, cache.num_experts), -1, dtype=torch.int32)
    for layer, items in per_layer.items():
        for e, s in items.items():
            fills[layer, e] = s
    return fills


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


def test_candidates_are_empty_slots_then_the_policys_victims(make_store):
    store, _ = make_store(2, 8)
    cache = ExpertCache(store, slots_per_layer=4, device="cpu", policy="lru")
    cache.prefetch({0: [0, 1, 2], 1: [0, 1, 2, 3]})
    cache.expire_prefetches()  # no longer the draft's predictions: evictable
    cache.pin(1, [3])
    cache.streamed.record_streamed(1, [0], [])  # expert 0 of layer 1 used last: 1, then 2, go first
    before = [cache.slot_states(layer) for layer in range(2)]
    slots, experts, claimed = cache.streamed.prepare_fills(3)
    assert slots.dtype == experts.dtype == claimed.dtype == torch.int32
    assert tuple(slots.shape) == tuple(experts.shape) == (2, 3)
    assert experts[0].tolist() == [-1, 0, 1]  # the empty slot, then LRU order
    assert slots[0].tolist() == [3, cache.slot_of(0, 0), cache.slot_of(0, 1)]
    assert experts[1].tolist() == [1, 2, 0]  # pinned 3 is never a candidate
    assert [cache.slot_states(layer) for layer in range(2)] == before  # nothing evicted
    for layer in range(2):
        assert claimed[layer].tolist() == [cache.slot_of(layer, e) for e in range(8)]
    assert cache.stats()["total"]["evictions"] == 0
    with pytest.raises(ValueError, match="spares_per_layer must be an int >= 1"):
        cache.streamed.prepare_fills(0)


def test_prefetched_and_loading_experts_are_no_candidates(make_store):
    store, _ = make_store(1, 8)
    engine = DeferredCopyEngine("cpu")
    cache = ExpertCache(store, slots_per_layer=3, device="cpu", copy_engine=engine)
    cache.prefetch({0: [4, 5]})
    engine.synchronize()
    cache.streamed.record_streamed(0, [4, 5], [])  # used: evictable from now on
    cache.prefetch({0: [6]})  # the draft's prediction, and still loading
    slots, experts, claimed = cache.streamed.prepare_fills(3)
    assert sorted(x for x in experts[0].tolist() if x >= 0) == [4, 5]
    assert cache.slot_of(0, 6) not in slots[0].tolist()
    assert claimed[0, 6].item() == cache.slot_of(0, 6)  # loading: it may not be filled
    assert cache.expert_to_slot(0)[6].item() == -1  # its copy has not landed


def test_a_landed_load_is_queried_once_by_the_candidate_choice(make_store):
    # prepare_fills runs before every streamed step: a slot whose load has landed drops its
    # event there, so later steps do not query it again; one still loading keeps it.
    store, _ = make_store(1, 8)
    engine = DeferredCopyEngine("cpu")
    cache = ExpertCache(store, slots_per_layer=4, device="cpu", copy_engine=engine)
    cache.prefetch({0: [1, 2]})
    engine.synchronize()
    cache.streamed.record_streamed(0, [1, 2], [])
    cache.prefetch({0: [3]})  # still loading
    pool = cache._residency.pools[0]
    landed = [cache.slot_of(0, 1), cache.slot_of(0, 2)]
    assert all(pool.ready[s] is not None for s in landed)
    slots, experts, _ = cache.streamed.prepare_fills(3)
    assert [pool.ready[s] for s in landed] == [None, None]
    assert pool.ready[cache.slot_of(0, 3)] is not None  # not landed: kept, and no candidate
    assert cache.slot_of(0, 3) not in slots[0].tolist()
    assert sorted(x for x in experts[0].tolist() if x >= 0) == [1, 2]
    assert cache.streamed.prepare_fills(3)[1].tolist() == experts.tolist()  # the same choice again


def test_a_fill_makes_the_streamed_expert_resident_and_evicts_the_candidate(make_store):
    store, ref = make_store(2, 6)
    cache = ExpertCache(store, slots_per_layer=3, device="cpu", policy="lru")
    cache.streaming = True
    cache.prefetch({0: [0, 1], 1: [0]})
    cache.expire_prefetches()
    cache.streamed.record_streamed(0, [1], [])  # expert 0 is layer 0's LRU expert
    slots, experts, _ = cache.streamed.prepare_fills(2)
    candidates = candidates_of(slots, experts, 0)
    assert sorted(candidates.values()) == [-1, 0]
    fills = {5: int(slots[0, 0]), 2: int(slots[0, 1])}  # the empty slot, then expert 0's
    fill_like_the_kernels(cache, ref, 0, fills, candidates)
    cache.streamed.commit_fills(fills_tensor(cache, {0: fills}))
    cache.streamed.mark_streamed_use()
    cache.streamed.record_streamed(0, [1, 2, 5], [2, 5], filled=fills)
    cache.streamed.record_streamed(1, [3], [3])  # streamed without a fill: not resident
    assert sorted(cache.resident_experts(0)) == [1, 2, 5]
    for e, s in fills.items():
        assert cache.slot_of(0, e) == s
        assert cache.expert_to_slot(0)[e].item() == s
        for name, t in cache.slot_tensors(0).items():
            assert torch.equal(t[s], ref[(0, e)][name])
    assert cache.expert_to_slot(0)[0].item() == -1  # evicted for the fill
    assert cache.lookup(1, [3]) == ([], [3])
    assert cache.expert_to_slot(1).tolist() == [0, -1, -1, -1, -1, -1]  # layer 1 unchanged
    total = cache.stats()["total"]
    assert total["streamed_fills"] == 2
    assert total["streamed_reads"] == 3
    assert total["evictions"] == 1
    assert total["bytes_moved"] == (3 + 3) * store.expert_bytes(0)  # 3 prefetched, 3 streamed
    cache.streamed.record_streamed(0, [2, 5], [])  # the next verification hits the filled experts
    assert cache.stats()["total"]["hits"] == 2 + 2  # expert 1 twice before, now 2 and 5
    cache.prefetch({0: [4]})  # a load evicts the LRU expert, 1, as from any slot
    assert sorted(cache.resident_experts(0)) == [2, 4, 5]
    assert cache.expert_to_slot(0)[1].item() == -1


def test_bad_fills_are_refused(make_store):
    store, _ = make_store(1, 6)
    cache = ExpertCache(store, slots_per_layer=3, device="cpu")
    cache.prefetch({0: [0]})
    slots, _, _ = cache.streamed.prepare_fills(1)
    spare = int(slots[0, 0])
    with pytest.raises(ValueError, match="fill of expert 4 into slot"):
        cache.streamed.record_streamed(0, [4], [], filled={4: spare})  # not streamed
    cache.streamed.prepare_fills(1)
    with pytest.raises(ValueError, match="fill of expert 4 into slot"):
        cache.streamed.record_streamed(0, [4], [4], filled={4: cache.slot_of(0, 0)})  # no candidate
    with pytest.raises(ValueError, match="fill of expert 4 into slot"):
        cache.streamed.record_streamed(0, [4], [4], filled={4: spare})  # no prepare_fills since
    with pytest.raises(TypeError, match=r"fills must be int32 \[L=1, E=6\]"):
        cache.streamed.commit_fills(torch.zeros(1, 6, dtype=torch.int64))


def test_commit_writes_only_the_filled_entries(make_store):
    store, _ = make_store(1, 6)
    cache = ExpertCache(store, slots_per_layer=4, device="cpu")
    cache.prefetch({0: [0, 1]})
    mapping = cache.expert_to_slot(0)
    mapping[4] = 7  # stands for an entry another stream is writing: must not be touched
    cache.streamed.commit_fills(torch.tensor([[-1, -1, 3, -1, -1, -1]], dtype=torch.int32))
    assert mapping.tolist() == [cache.slot_of(0, 0), cache.slot_of(0, 1), 3, -1, 7, -1]


@cuda
def test_a_captured_wait_for_landing_waits_at_each_replay_for_the_loads_before_its_launch():
    # wait_for_landing inside a CUDA graph is a wait on the layer's external event: each
    # replay waits for the loads issued before it was launched (the copy stream sleeps first,
    # so they land late); a graph without the wait reads the map before they land.
    store, ref = build_store(2, 6, CUDA_LAYOUT, seed=8)
    cache = ExpertCache(store, slots_per_layer=3, device="cuda")
    cache.streaming = True
    waited = torch.full((6,), -2, dtype=torch.int32, device="cuda")
    unwaited = torch.full_like(waited, -2)
    data = torch.zeros(256, 256, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        with_wait, without_wait = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.graph(with_wait, stream=side):
            cache.streamed.wait_for_landing(0)
            waited.copy_(cache.expert_to_slot(0))
            data.copy_(cache.slot_tensors(0)["w"].sum(dim=0))
        with torch.cuda.graph(without_wait, stream=side):
            unwaited.copy_(cache.expert_to_slot(0))
    torch.cuda.current_stream().wait_stream(side)
    for experts in ([4], [1, 2]):
        with torch.cuda.stream(cache.copy_engine.stream):
            torch.cuda._sleep(SLEEP_CYCLES)  # the loads below land late
        cache.prefetch({0: experts, 1: [5]})
        without_wait.replay()
        with_wait.replay()
        torch.cuda.synchronize()
        landed = cache.expert_to_slot(0).tolist()
        assert waited.tolist() == landed
        assert all(landed[e] >= 0 for e in experts)
        assert all(unwaited.tolist()[e] == -1 for e in experts)  # read before they landed
    expect = sum(ref[(0, e)]["w"] for e in (4, 1, 2))
    torch.testing.assert_close(data.cpu(), expect, rtol=1e-4, atol=1e-4)
