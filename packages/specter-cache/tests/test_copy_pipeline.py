"""The copy pipeline: map updates in copy order, the streamed path's early invalidation, held
data copies, and on CUDA the waits for each slot's last reader."""

import random

import pytest
import torch

from cache_helpers import (
    CUDA_LAYOUT,
    SETTLING_CALLS,
    SLEEP_CYCLES,
    assert_slots_hold,
    build_store,
    cuda,
)
from specter_cache import ExpertCache, ExpertLayout
from specter_cache.copy_engine import DeferredCopyEngine

LAYOUT = ExpertLayout({"gate_up": ((8, 4), torch.float32), "down": ((4, 4), torch.float32)})


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
    SETTLING_CALLS[name](cache)
    cache.settle()
    assert cache.copies_held == 1
    assert cache.lookup(0, [4]) == ([4], [])  # decided on the host: resident for planning


@pytest.mark.parametrize("lead", [-1, 1.5, True, "2"])
def test_prefetch_rejects_a_bad_lead(make_store, lead):
    _, _, _, cache = _streaming_cache_with_victims(make_store)
    with pytest.raises(ValueError, match=rf"lead must be None .* got {lead!r}"):
        cache.prefetch({0: [4]}, lead=lead)


@cuda
def test_a_slot_is_not_overwritten_while_a_kernel_still_reads_it():
    store, ref = build_store(1, 4, CUDA_LAYOUT, seed=2)
    cache = ExpertCache(store, slots_per_layer=1, device="cuda")
    x = torch.randn(8, 256, device="cuda")
    for wave in cache.acquire(0, [1]):
        torch.cuda._sleep(SLEEP_CYCLES)  # the reading kernel starts late on the compute stream
        out = x @ cache.slot_tensors(0)["w"][wave.slots[0]].T
        wave.release()
    cache.prefetch({0: [2]})  # evicts expert 1 from the only slot: must wait for the last use
    expect = x.cpu() @ ref[(0, 1)]["w"].T
    torch.testing.assert_close(out.cpu(), expect, rtol=1e-3, atol=1e-3)
    cache.synchronize()
    assert cache.expert_to_slot(0).tolist() == [-1, -1, 0, -1]
    torch.testing.assert_close(cache.slot_tensors(0)["w"][0].cpu(), ref[(0, 2)]["w"])


@cuda
def test_streaming_loads_take_experts_off_the_map_early_and_wait_for_the_last_reader():
    store, ref = build_store(1, 4, CUDA_LAYOUT, seed=5)
    cache = ExpertCache(store, slots_per_layer=1, device="cuda")
    cache.streaming = True
    cache.prefetch({0: [1]})
    cache.synchronize()
    x = torch.randn(8, 256, device="cuda")
    torch.cuda._sleep(SLEEP_CYCLES)  # a streamed verification that reads slot 0 late
    out = x @ cache.slot_tensors(0)["w"][0].T
    cache.streamed.mark_streamed_use()
    with torch.cuda.stream(cache.copy_engine.stream):
        torch.cuda._sleep(SLEEP_CYCLES)  # the copy stream is busy: expert 2 lands late
    cache.prefetch({0: [2]})
    cache.streamed.stream_guard()
    seen = cache.expert_to_slot(0).clone()  # what the next verification would read
    torch.cuda.synchronize()
    assert seen.tolist() == [-1, -1, -1, -1]  # expert 1 is off the map before 2 lands
    torch.testing.assert_close(out.cpu(), x.cpu() @ ref[(0, 1)]["w"].T, rtol=1e-3, atol=1e-3)
    assert cache.expert_to_slot(0).tolist() == [-1, -1, 0, -1]
    torch.testing.assert_close(cache.slot_tensors(0)["w"][0].cpu(), ref[(0, 2)]["w"])


@cuda
def test_streaming_loads_keep_a_waves_map_entry_until_the_wave_ran():
    # A wave's kernel reads expert_to_slot for its experts and cannot take a -1: the side
    # stream's invalidation waits for the wave's last use like the data copy does.
    store, _ = build_store(1, 4, CUDA_LAYOUT, seed=6)
    cache = ExpertCache(store, slots_per_layer=1, device="cuda")
    cache.streaming = True
    for wave in cache.acquire(0, [1]):
        torch.cuda._sleep(SLEEP_CYCLES)  # the wave's kernel starts late
        seen = cache.expert_to_slot(0)[1].clone()
        wave.release()
    cache.prefetch({0: [2]})  # evicts expert 1 while the wave is still queued
    torch.cuda.synchronize()
    assert int(seen) == 0
    assert cache.expert_to_slot(0).tolist() == [-1, -1, 0, -1]


@cuda
def test_held_copies_wait_for_the_last_streamed_verification_not_the_one_launched_after():
    # prefetch(lead=0) issues the waits now: the held copies go out after a verification
    # launched in between (release_copies), wait only for the verification before it, and
    # overwrite the victim's slot after that one read it.
    store, ref = build_store(1, 4, CUDA_LAYOUT, seed=7)
    cache = ExpertCache(store, slots_per_layer=1, device="cuda")
    cache.streaming = True
    cache.prefetch({0: [1]})
    cache.synchronize()
    x = torch.randn(8, 256, device="cuda")
    torch.cuda._sleep(SLEEP_CYCLES)  # the last streamed verification reads slot 0 late
    out = x @ cache.slot_tensors(0)["w"][0].T
    cache.streamed.mark_streamed_use()
    cache.prefetch({0: [2]}, lead=0)
    assert cache.copies_held == 1
    cache.streamed.stream_guard()
    seen = cache.expert_to_slot(0).clone()  # the verification launched now reads the map
    torch.cuda._sleep(SLEEP_CYCLES)  # ... and runs long
    running = cache.copy_engine.record_compute()
    assert cache.release_copies() == 1
    cache.streamed.mark_streamed_use()
    with cache.copy_engine.copy_context():
        landed = cache.copy_engine.record()
    landed.synchronize()
    assert not running.query()  # the held copy did not wait for the verification after it
    torch.cuda.synchronize()
    assert seen.tolist() == [-1, -1, -1, -1]  # expert 1 off the map, expert 2 not yet on
    torch.testing.assert_close(out.cpu(), x.cpu() @ ref[(0, 1)]["w"].T, rtol=1e-3, atol=1e-3)
    assert cache.expert_to_slot(0).tolist() == [-1, -1, 0, -1]
    torch.testing.assert_close(cache.slot_tensors(0)["w"][0].cpu(), ref[(0, 2)]["w"])
