"""ExpertCache as a whole: construction and argument checks, lazy stores, prefetch with a plan,
and random traffic on CUDA without host syncs."""

import pytest
import torch

from cache_helpers import CUDA_LAYOUT, build_store, cuda
from specter_cache import ExpertCache, ExpertLayout, ExpertStore, RoutingCounter
from specter_cache.copy_engine import CudaCopyEngine

LAYOUT = ExpertLayout({"gate_up": ((8, 4), torch.float32), "down": ((4, 4), torch.float32)})


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


@cuda
def test_store_is_pinned_and_the_engine_is_a_copy_stream():
    store, _ = build_store(1, 4, CUDA_LAYOUT)
    assert store.is_pinned
    assert store.get(0, 0)["w"].is_pinned()
    cache = ExpertCache(store, slots_per_layer=2, device="cuda")
    assert isinstance(cache.copy_engine, CudaCopyEngine)
    assert cache.copy_engine.stream != torch.cuda.current_stream()


@cuda
def test_random_traffic_matches_the_store_and_needs_no_host_sync():
    store, ref = build_store(2, 12, CUDA_LAYOUT, seed=3)
    cache = ExpertCache(store, slots_per_layer=4, device="cuda", policy="predictive")
    counter = RoutingCounter(2, 12, "cuda")
    g = torch.Generator().manual_seed(4)
    x = torch.randn(4, 256, device="cuda")
    results = []
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any host sync below raises
    try:
        for step in range(30):
            layer = step % 2
            if step % 3 == 0:
                plan = {layer: torch.randperm(12, generator=g)[:4].tolist()}
                cache.set_plan(plan)
                cache.prefetch(plan)
            counter.observe(layer, torch.randint(0, 12, (4, 2), device="cuda"))
            needed = torch.randperm(12, generator=g)[: int(torch.randint(1, 7, (1,), generator=g))]
            for wave in cache.acquire(layer, needed.tolist()):
                for e, s in zip(wave.experts, wave.slots, strict=True):
                    w = cache.slot_tensors(layer)["w"][s]
                    results.append((layer, e, x @ w.T))
                wave.release()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    for layer, e, y in results:
        torch.testing.assert_close(y.cpu(), x.cpu() @ ref[(layer, e)]["w"].T, rtol=1e-3, atol=1e-3)
    cache.synchronize()
    for layer in range(2):
        expect = [-1] * 12
        for slot, info in enumerate(cache.slot_states(layer)):
            if info.expert >= 0:
                expect[info.expert] = slot
        assert cache.expert_to_slot(layer).tolist() == expect
    total = cache.stats()["total"]
    assert total["waves"] >= 30
    assert total["overflow_acquires"] > 0
    assert int(counter.counts.sum()) == 30 * 8
