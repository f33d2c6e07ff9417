"""Acquisitions: waves in readiness order compute a MoE layer exactly, protect their slots and
release every claim."""

import pytest
import torch
import torch.nn.functional as F

from cache_helpers import CUDA_LAYOUT, SLEEP_CYCLES, assert_slots_hold, build_store, cuda, protected
from specter_cache import ExpertCache, ExpertLayout
from specter_cache.copy_engine import DeferredCopyEngine

LAYOUT = ExpertLayout({"gate_up": ((8, 4), torch.float32), "down": ((4, 4), torch.float32)})


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


@cuda
def test_compute_waits_for_a_delayed_copy():
    store, ref = build_store(1, 4, CUDA_LAYOUT, seed=1)
    cache = ExpertCache(store, slots_per_layer=2, device="cuda")
    x = torch.randn(8, 256, device="cuda")
    with torch.cuda.stream(cache.copy_engine.stream):
        torch.cuda._sleep(SLEEP_CYCLES)  # the copy stream is busy: the load lands late
    cache.prefetch({0: [3]})
    outs = {}
    for wave in cache.acquire(0, [3]):
        slot = wave.slots[0]
        outs[3] = x @ cache.slot_tensors(0)["w"][slot].T + cache.slot_tensors(0)["b"][slot]
        wave.release()
    expect = x.cpu() @ ref[(0, 3)]["w"].T + ref[(0, 3)]["b"]
    torch.testing.assert_close(outs[3].cpu(), expect, rtol=1e-3, atol=1e-3)
    assert cache.stats()["total"]["stall_seconds"] > 0
