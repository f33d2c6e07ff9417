"""The cache's side of streamed fills: spare slots, the device map's commit, adoption."""

import pytest
import torch

from specter_cache import DeferredCopyEngine, ExpertCache


def fill_like_the_kernel(cache, ref, layer, fills):
    """What the grouped kernel does on a fill: the streamed expert's tensors into its slot."""
    slots = cache.slot_tensors(layer)
    for e, s in fills.items():
        for name, t in slots.items():
            t[s].copy_(ref[(layer, e)][name])


def fills_tensor(cache, per_layer):
    fills = torch.full((cache.num_layers, cache.num_experts), -1, dtype=torch.int32)
    for layer, items in per_layer.items():
        for e, s in items.items():
            fills[layer, e] = s
    return fills


def test_prepare_fills_hands_out_empty_slots_then_evicts_the_policys_victims(make_store):
    store, _ = make_store(2, 8)
    cache = ExpertCache(store, slots_per_layer=4, device="cpu", policy="lru")
    cache.prefetch({0: [0, 1, 2], 1: [0, 1, 2, 3]})
    cache.expire_prefetches()  # no longer the draft's predictions: evictable
    cache.pin(1, [3])
    cache.record_streamed(1, [0], [])  # expert 0 of layer 1 used last: 1 is the LRU victim
    spares, claimed = cache.prepare_fills(2)
    assert spares.dtype == torch.int32
    assert tuple(spares.shape) == (2, 2)
    assert sorted(spares[0].tolist()) == [0, 3]  # the empty slot, then LRU expert 0's
    assert cache.stats()["per_layer"][0]["evictions"] == 1
    assert sorted(cache.resident_experts(0)) == [1, 2]  # LRU expert 0 went first
    assert sorted(cache.resident_experts(1)) == [0, 3]  # pinned 3 and recent 0 stay
    assert sorted(spares[1].tolist()) == sorted(
        [s for s, info in enumerate(cache.slot_states(1)) if info.expert < 0]
    )
    maps = torch.stack([cache.expert_to_slot(layer) for layer in range(2)])
    assert (maps >= 0).sum().item() == 4  # evicted experts are off the device map
    for layer in range(2):
        expected = [cache.slot_of(layer, e) for e in range(8)]
        assert claimed[layer].tolist() == expected
        assert cache.expert_to_slot(layer).tolist() == expected
    with pytest.raises(ValueError, match="spares_per_layer must be an int >= 1"):
        cache.prepare_fills(0)


def test_prepare_fills_keeps_prefetched_and_loading_experts(make_store):
    store, _ = make_store(1, 8)
    engine = DeferredCopyEngine("cpu")
    cache = ExpertCache(store, slots_per_layer=3, device="cpu", copy_engine=engine)
    cache.prefetch({0: [4, 5]})
    engine.synchronize()
    cache.record_streamed(0, [4, 5], [])  # used: evictable from now on
    cache.prefetch({0: [6]})  # the draft's prediction, and still loading
    spares, claimed = cache.prepare_fills(3)
    assert sorted(cache.resident_experts(0)) == [6]
    assert sorted(x for x in spares[0].tolist() if x >= 0) == sorted(
        s for s in range(3) if s != cache.slot_of(0, 6)
    )
    assert claimed[0, 6].item() == cache.slot_of(0, 6)  # loading: it may not be filled
    assert cache.expert_to_slot(0)[6].item() == -1  # its copy has not landed


def test_a_fill_makes_the_streamed_expert_resident(make_store):
    store, ref = make_store(2, 6)
    cache = ExpertCache(store, slots_per_layer=3, device="cpu", policy="lru")
    cache.streaming = True
    cache.prefetch({0: [0], 1: [0]})
    spares, _ = cache.prepare_fills(2)
    layer0 = {5: int(spares[0, 0]), 2: int(spares[0, 1])}
    fill_like_the_kernel(cache, ref, 0, layer0)
    cache.commit_fills(fills_tensor(cache, {0: layer0}))
    cache.mark_streamed_use()
    cache.record_streamed(0, [0, 2, 5], [2, 5], filled=layer0)
    cache.record_streamed(1, [3], [3])  # streamed without a fill: not resident
    for e, s in layer0.items():
        assert cache.slot_of(0, e) == s
        assert cache.expert_to_slot(0)[e].item() == s
        for name, t in cache.slot_tensors(0).items():
            assert torch.equal(t[s], ref[(0, e)][name])
    assert cache.lookup(1, [3]) == ([], [3])
    assert cache.expert_to_slot(1).tolist() == [0, -1, -1, -1, -1, -1]  # layer 1 unchanged
    total = cache.stats()["total"]
    assert total["streamed_fills"] == 2
    assert total["streamed_reads"] == 3
    assert total["bytes_moved"] == 2 * store.expert_bytes(0) + 3 * store.expert_bytes(0)
    # The next verification hits the filled experts.
    cache.record_streamed(0, [2, 5], [])
    assert cache.stats()["total"]["hits"] == 1 + 2
    # A later load may evict a filled expert like any other (LRU: expert 0, then 2).
    cache.prefetch({0: [1]})
    assert 0 not in cache.resident_experts(0)
    assert cache.expert_to_slot(0)[0].item() == -1


def test_bad_fills_are_refused(make_store):
    store, _ = make_store(1, 6)
    cache = ExpertCache(store, slots_per_layer=3, device="cpu")
    cache.prefetch({0: [0]})
    spares, _ = cache.prepare_fills(1)
    spare = int(spares[0, 0])
    with pytest.raises(ValueError, match="fill of expert 4 into slot"):
        cache.record_streamed(0, [4], [], filled={4: spare})  # not streamed
    with pytest.raises(ValueError, match="fill of expert 4 into slot"):
        cache.record_streamed(0, [4], [4], filled={4: cache.slot_of(0, 0)})  # not a spare
    with pytest.raises(TypeError, match=r"fills must be int32 \[L=1, E=6\]"):
        cache.commit_fills(torch.zeros(1, 6, dtype=torch.int64))


def test_commit_writes_only_the_filled_entries(make_store):
    store, _ = make_store(1, 6)
    cache = ExpertCache(store, slots_per_layer=4, device="cpu")
    cache.prefetch({0: [0, 1]})
    mapping = cache.expert_to_slot(0)
    mapping[4] = 7  # stands for an entry another stream is writing: must not be touched
    cache.commit_fills(torch.tensor([[-1, -1, 3, -1, -1, -1]], dtype=torch.int32))
    assert mapping.tolist() == [cache.slot_of(0, 0), cache.slot_of(0, 1), 3, -1, 7, -1]
