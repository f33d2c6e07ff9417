"""ExpertCache on the CPU: slots, maps, waves, protection, prefetch and statistics."""

import random

import pytest
import torch
import torch.nn.functional as F

from specter_cache import ExpertCache, ExpertLayout, ExpertStore, LRUPolicy
from specter_cache.copy_engine import DeferredCopyEngine

LAYOUT = ExpertLayout({"gate_up": ((8, 4), torch.float32), "down": ((4, 4), torch.float32)})


def assert_slots_hold(cache, store, layer, experts):
    tensors = cache.slot_tensors(layer)
    for e in experts:
        slot = cache.slot_of(layer, e)
        assert slot >= 0, f"expert {e} is not resident"
        for name, ref in store.get(layer, e).items():
            assert torch.equal(tensors[name][slot], ref), (layer, e, name)


def protected(cache, layer):
    return [s.protected for s in cache.slot_states(layer)]


def test_slot_counts_from_a_budget_and_bad_sizes(make_store):
    store, _ = make_store(3, 6, LAYOUT)
    per_expert = LAYOUT.payload_bytes
    cache = ExpertCache(store, budget_bytes=3 * 4 * per_expert + 5, device="cpu")
    assert cache.slots_per_layer == (4, 4, 4)
    assert cache.device_bytes == 3 * 4 * per_expert
    assert cache.slot_tensors(1)["gate_up"].shape == (4, 8, 4)
    big = ExpertCache(store, budget_bytes=100 * 3 * per_expert, device="cpu")
    assert big.slots_per_layer == (6, 6, 6)  # never more slots than experts
    assert ExpertCache(store, slots_per_layer=[1, 2, 3], device="cpu").slots_per_layer == (1, 2, 3)
    with pytest.raises(ValueError, match="exactly one"):
        ExpertCache(store, device="cpu")
    with pytest.raises(ValueError, match="exactly one"):
        ExpertCache(store, slots_per_layer=2, budget_bytes=10**9, device="cpu")
    with pytest.raises(ValueError, match="below one slot per layer"):
        ExpertCache(store, budget_bytes=per_expert, device="cpu")
    with pytest.raises(ValueError, match=r"\[1, 6\]"):
        ExpertCache(store, slots_per_layer=7, device="cpu")
    with pytest.raises(ValueError, match="one per layer"):
        ExpertCache(store, slots_per_layer=[2, 2], device="cpu")
    with pytest.raises(TypeError, match="ExpertStore"):
        ExpertCache({}, slots_per_layer=2, device="cpu")
    with pytest.raises(ValueError, match="'cpu' and 'cuda'"):
        ExpertCache(store, slots_per_layer=2, device="meta")


def moe_reference(x, ids, weights, store, layer):
    """Token-by-token MoE FFN straight from the store: sum_k w_k * down(silu(g) * u)."""
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for k in range(ids.shape[1]):
            w = store.get(layer, int(ids[t, k]))
            gate, up = (x[t] @ w["gate_up"].T).chunk(2)
            out[t] += weights[t, k] * (w["down"] @ (F.silu(gate) * up))
    return out


def moe_by_waves(x, ids, weights, cache, layer):
    """Expert-wise MoE over cache slots, reading only the experts of each wave."""
    out = torch.zeros_like(x)
    seen = []
    for wave in cache.acquire(layer, ids.unique().tolist()):
        slots = cache.slot_tensors(layer)
        expert_to_slot = cache.expert_to_slot(layer)
        for e in wave.experts:
            seen.append(e)
            slot = int(expert_to_slot[e])
            assert slot == wave.slots[wave.experts.index(e)]
            rows, which = (ids == e).nonzero(as_tuple=True)
            gate, up = (x[rows] @ slots["gate_up"][slot].T).chunk(2, dim=-1)
            y = (F.silu(gate) * up) @ slots["down"][slot].T
            out.index_add_(0, rows, weights[rows, which, None] * y)
        wave.release()
    assert sorted(seen) == sorted(ids.unique().tolist())  # every expert exactly once
    return out


@pytest.mark.parametrize("engine", ["immediate", "deferred"])
@pytest.mark.parametrize("slots", [2, 3, 6])
def test_waves_compute_a_moe_layer_exactly_like_the_reference(make_store, engine, slots):
    store, _ = make_store(2, 8, LAYOUT, seed=slots)
    copy_engine = DeferredCopyEngine() if engine == "deferred" else None
    cache = ExpertCache(store, slots_per_layer=slots, device="cpu", copy_engine=copy_engine)
    g = torch.Generator().manual_seed(11)
    for step in range(6):
        layer = step % 2
        x = torch.randn(5, 4, generator=g)
        ids = torch.stack([torch.randperm(8, generator=g)[:2] for _ in range(5)])
        weights = torch.rand(5, 2, generator=g)
        if step % 3 == 1:
            cache.prefetch({layer: torch.randperm(8, generator=g)[:slots].tolist()})
        torch.testing.assert_close(
            moe_by_waves(x, ids, weights, cache, layer),
            moe_reference(x, ids, weights, store, layer),
        )
        assert protected(cache, layer) == [0] * slots


def test_resident_experts_come_first_then_the_loads(make_store):
    store, _ = make_store(1, 8, LAYOUT)
    cache = ExpertCache(store, slots_per_layer=4, device="cpu")
    assert cache.prefetch({0: [6, 2]}) == {0: [6, 2]}
    acq = cache.acquire(0, [5, 2, 7, 6, 2])
    assert acq.experts == (5, 2, 7, 6)
    assert acq.hits == (2, 6)
    assert acq.misses == (5, 7)
    waves = [w.experts for w in acq]
    assert waves == [(2, 6), (5, 7)]
    st = cache.stats()["total"]
    assert (st["hits"], st["misses"], st["waves"], st["prefetch_used"]) == (2, 2, 2, 2)
    assert st["bytes_moved"] == 4 * LAYOUT.payload_bytes
    assert cache.lookup(0, [7, 1, 5]) == ([7, 5], [1])


def test_deferred_copies_are_handed_out_in_readiness_order(make_store):
    store, _ = make_store(1, 8, LAYOUT)
    engine = DeferredCopyEngine()
    cache = ExpertCache(
        store, slots_per_layer=4, device="cpu", copy_engine=engine, coalesce_arrivals=False
    )
    cache.prefetch({0: [1]})
    engine.synchronize()  # expert 1 is resident and ready
    cache.prefetch({0: [2, 3]})  # in flight
    acq = cache.acquire(0, [4, 3, 1, 2])
    assert acq.hits == (3, 1, 2)
    waves = iter(acq)
    first = next(waves)
    assert first.experts == (1,)  # the only ready expert
    assert not cache.slot_states(0)[cache.slot_of(0, 2)].ready
    second = next(waves)  # nothing arrived: waits for the earliest copy (expert 2)
    assert second.experts == (2,)
    assert_slots_hold(cache, store, 0, [2])
    assert not cache.slot_states(0)[cache.slot_of(0, 4)].ready
    engine.step(engine.pending)  # 3 and 4 arrive together
    third = next(waves)
    assert set(third.experts) == {3, 4}
    assert_slots_hold(cache, store, 0, [1, 2, 3, 4])
    with pytest.raises(StopIteration):
        next(waves)
    assert protected(cache, 0) == [0, 0, 0, 0]
    assert cache.stats()["total"]["stall_seconds"] >= 0


def test_coalesced_arrivals_form_one_wave_of_everything_in_flight(make_store):
    store, _ = make_store(1, 8, LAYOUT)
    engine = DeferredCopyEngine()
    cache = ExpertCache(store, slots_per_layer=4, device="cpu", copy_engine=engine)
    cache.prefetch({0: [1]})
    engine.synchronize()  # expert 1 is resident and ready
    cache.prefetch({0: [2, 3]})  # in flight
    waves = iter(cache.acquire(0, [4, 3, 1, 2]))
    assert next(waves).experts == (1,)  # resident first
    second = next(waves)  # nothing arrived: every in-flight load, in issue order
    assert second.experts == (2, 3, 4)
    assert_slots_hold(cache, store, 0, [1, 2, 3, 4])
    with pytest.raises(StopIteration):
        next(waves)
    assert cache.stats()["total"]["waves"] == 2
    assert protected(cache, 0) == [0, 0, 0, 0]


def test_more_experts_than_slots_compute_in_waves_without_deadlock(make_store):
    store, _ = make_store(1, 9, LAYOUT)
    cache = ExpertCache(store, slots_per_layer=2, device="cpu")
    cache.prefetch({0: [0, 1]})
    needed = [8, 0, 3, 1, 5, 7]
    seen = []
    for wave in cache.acquire(0, needed):
        assert len(wave.experts) <= 2
        assert_slots_hold(cache, store, 0, wave.experts)
        seen += wave.experts
    assert seen[:2] == [0, 1]  # residents first
    assert sorted(seen) == sorted(needed)
    st = cache.stats()["total"]
    assert st["overflow_acquires"] == 1
    assert st["waves"] == 3
    assert st["demand_loads"] == 4
    assert protected(cache, 0) == [0, 0]


def test_protected_slots_are_never_evicted_and_contention_raises(make_store):
    store, _ = make_store(1, 8, LAYOUT)
    cache = ExpertCache(store, slots_per_layer=2, device="cpu")
    holder = iter(cache.acquire(0, [0, 1]))
    wave = next(holder)
    assert set(wave.experts) == {0, 1}
    assert protected(cache, 0) == [1, 1]
    issued = cache.prefetch({0: [5, 6]})
    assert issued == {0: []}
    assert cache.stats()["total"]["prefetch_dropped"] == 2
    assert sorted(cache.resident_experts(0)) == [0, 1]
    other = iter(cache.acquire(0, [1, 4]))
    assert next(other).experts == (1,)  # resident: shared with the holder
    with pytest.raises(RuntimeError, match="protected by other open acquisitions"):
        next(other)
    assert_slots_hold(cache, store, 0, [0, 1])
    holder.close()  # leaving the loop early releases everything
    assert protected(cache, 0) == [0, 0]
    assert [w.experts for w in cache.acquire(0, [1, 4])] == [(1,), (4,)]


def test_breaking_out_of_the_loop_releases_every_claim(make_store):
    store, _ = make_store(1, 8, LAYOUT)
    cache = ExpertCache(store, slots_per_layer=3, device="cpu")
    for wave in cache.acquire(0, [1, 2, 3, 4, 5]):
        assert wave.experts
        break
    assert protected(cache, 0) == [0, 0, 0]
    acq = cache.acquire(0, [6, 7])
    with acq:
        assert protected(cache, 0).count(1) == 2
    assert protected(cache, 0) == [0, 0, 0]
    with pytest.raises(RuntimeError, match="closed before iteration"):
        iter(acq)
    fresh = cache.acquire(0, [6])
    assert [w.experts for w in fresh] == [(6,)]
    with pytest.raises(RuntimeError, match="only once"):
        iter(fresh)


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


def test_device_map_matches_residency_under_random_traffic(make_store):
    store, _ = make_store(2, 10, LAYOUT)
    cache = ExpertCache(store, slots_per_layer=3, device="cpu", policy="lfu")
    rng = random.Random(4)
    for _ in range(60):
        layer = rng.randrange(2)
        if rng.random() < 0.4:
            cache.prefetch({layer: rng.sample(range(10), rng.randint(0, 4))})
        else:
            for wave in cache.acquire(layer, rng.sample(range(10), rng.randint(1, 5))):
                assert_slots_hold(cache, store, layer, wave.experts)
        for lay in range(2):
            expect = torch.full((10,), -1, dtype=torch.int32)
            for slot, info in enumerate(cache.slot_states(lay)):
                if info.expert >= 0:
                    expect[info.expert] = slot
            assert torch.equal(cache.expert_to_slot(lay), expect)
            assert_slots_hold(cache, store, lay, cache.resident_experts(lay))


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


def test_bad_arguments_are_rejected_with_the_value(make_store):
    store, _ = make_store(2, 8, LAYOUT)
    cache = ExpertCache(store, slots_per_layer=2, device="cpu")
    with pytest.raises(ValueError, match="layer must be an int in \\[0, 2\\), got 2"):
        cache.acquire(2, [1])
    with pytest.raises(ValueError, match="got 8"):
        cache.lookup(0, [1, 8])
    with pytest.raises(ValueError, match="got -1"):
        cache.prefetch({0: [-1]})
    with pytest.raises(TypeError, match="plan maps layer"):
        cache.prefetch([[1]])
    with pytest.raises(TypeError, match="sequence of ints"):
        cache.acquire(0, 3)
    # Tensors of ids work (duplicates removed, first-seen order).
    assert cache.acquire(0, torch.tensor([[3, 1], [1, 3]])).experts == (3, 1)


def test_pinned_store_is_not_required_on_cpu(make_store):
    store, _ = make_store(1, 4, LAYOUT, pin_memory=False)
    cache = ExpertCache(store, slots_per_layer=2, device="cpu")
    assert [w.experts for w in cache.acquire(0, [3])] == [(3,)]


def test_store_with_lazy_experts_loads_on_first_use(tmp_path):
    from safetensors.torch import save_file

    w = {f"e{e}": torch.randn(3, 2) for e in range(4)}
    save_file(w, str(tmp_path / "w.safetensors"))
    layout = ExpertLayout({"w": ((3, 2), torch.float32)})
    sources = {(0, e, "w"): (tmp_path / "w.safetensors", f"e{e}") for e in range(4)}
    store = ExpertStore.from_safetensors(1, 4, layout, sources)
    cache = ExpertCache(store, slots_per_layer=2, device="cpu")
    for wave in cache.acquire(0, [2]):
        assert torch.equal(cache.slot_tensors(0)["w"][wave.slots[0]], w["e2"])
    assert [store.is_loaded(0, e) for e in range(4)] == [False, False, True, False]


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


def test_prefetch_with_set_plan_is_set_plan_then_prefetch(make_store):
    caches = []
    for combined in (False, True):
        store, _ = make_store(2, 8)
        cache = ExpertCache(store, slots_per_layer=3, device="cpu", policy="predictive")
        cache.prefetch({0: [0, 1, 2], 1: [3, 4, 5]})
        plan = {0: [5, 1], 1: [6, 3, 7]}  # the plan protects 1 and 3 from eviction
        if combined:
            issued = cache.prefetch(plan, set_plan=True)
        else:
            cache.set_plan(plan)
            issued = cache.prefetch(plan)
        caches.append((issued, [cache.resident_experts(layer) for layer in range(2)]))
    assert caches[0] == caches[1]
    assert 1 in caches[1][1][0]  # planned: kept
    assert {3, 6, 7} <= set(caches[1][1][1])
    small, _ = make_store(1, 4)
    cache = ExpertCache(small, slots_per_layer=2, device="cpu")
    with pytest.raises(ValueError, match="expert ids must be ints in"):
        cache.prefetch({0: [9]}, set_plan=True)
