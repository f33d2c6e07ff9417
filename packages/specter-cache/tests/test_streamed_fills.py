"""The cache's side of streamed fills: candidate slots, the device map's commit, adoption."""

import pytest
import torch

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


def fills_tensor(cache, per_layer):
    fills = torch.full((cache.num_layers, cache.num_experts), -1, dtype=torch.int32)
    for layer, items in per_layer.items():
        for e, s in items.items():
            fills[layer, e] = s
    return fills


def candidates_of(slots, experts, layer):
    return {
        int(s): int(e)
        for s, e in zip(slots[layer].tolist(), experts[layer].tolist(), strict=True)
        if s >= 0
    }


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
