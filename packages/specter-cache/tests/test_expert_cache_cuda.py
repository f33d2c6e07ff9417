"""ExpertCache on a CUDA device: the copy stream, readiness and last-use events, no host syncs.

Skipped without a GPU (run on the GPU machine: ``pytest -m gpu``).
"""

import pytest
import torch

from cache_helpers import build_store
from specter_cache import (
    ExpertCache,
    ExpertLayout,
    PlannerConfig,
    PrefetchPlanner,
    RoutingCounter,
    SpeculativePrefetcher,
)
from specter_cache.copy_engine import CudaCopyEngine

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

LAYOUT = ExpertLayout({"w": ((256, 256), torch.float32), "b": ((256,), torch.float32)})
SLEEP_CYCLES = 50_000_000  # tens of milliseconds: far longer than the copies


def test_store_is_pinned_and_the_engine_is_a_copy_stream():
    store, _ = build_store(1, 4, LAYOUT)
    assert store.is_pinned
    assert store.get(0, 0)["w"].is_pinned()
    cache = ExpertCache(store, slots_per_layer=2, device="cuda")
    assert isinstance(cache.copy_engine, CudaCopyEngine)
    assert cache.copy_engine.stream != torch.cuda.current_stream()


def test_compute_waits_for_a_delayed_copy():
    store, ref = build_store(1, 4, LAYOUT, seed=1)
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


def test_a_slot_is_not_overwritten_while_a_kernel_still_reads_it():
    store, ref = build_store(1, 4, LAYOUT, seed=2)
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


def test_random_traffic_matches_the_store_and_needs_no_host_sync():
    store, ref = build_store(2, 12, LAYOUT, seed=3)
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


def test_prefetcher_on_cuda_prefetches_from_device_counters():
    store, _ = build_store(2, 8, LAYOUT, seed=5)
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


def test_warm_up_on_cuda_leaves_the_counts_and_the_first_plan_as_they_were():
    store, _ = build_store(2, 8, LAYOUT, seed=6)
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


def test_snapshot_async_waits_for_its_own_copy_not_for_later_work():
    counter = RoutingCounter(2, 8, "cuda")
    counter.observe(0, torch.tensor([[1, 3], [3, 5], [1, 3]], device="cuda"))
    counter.observe(1, torch.tensor([[6, 6]], device="cuda"))
    later = torch.tensor([[7, 7], [7, 7]], device="cuda")  # made now: a host copy syncs
    pending = counter.snapshot_async(2)
    torch.cuda._sleep(SLEEP_CYCLES)  # queued after the snapshot: a long "next draft step"
    counter.observe(0, later)
    counter.clear()
    plan = pending.result()
    assert plan == {0: [3, 1], 1: [6]}
    assert not torch.cuda.current_stream().query()  # the later work was not waited for
    torch.cuda.synchronize()
    assert pending.done()


def test_streaming_loads_take_experts_off_the_map_early_and_wait_for_the_last_reader():
    store, ref = build_store(1, 4, LAYOUT, seed=5)
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


def test_streaming_loads_keep_a_waves_map_entry_until_the_wave_ran():
    # A wave's kernel reads expert_to_slot for its experts and cannot take a -1: the side
    # stream's invalidation waits for the wave's last use like the data copy does.
    store, _ = build_store(1, 4, LAYOUT, seed=6)
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


def test_held_copies_wait_for_the_last_streamed_verification_not_the_one_launched_after():
    # prefetch(lead=0) issues the waits now: the held copies go out after a verification
    # launched in between (release_copies), wait only for the verification before it, and
    # overwrite the victim's slot after that one read it.
    store, ref = build_store(1, 4, LAYOUT, seed=7)
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


def test_published_counts_reach_the_host_from_a_captured_graph_while_it_runs():
    # The torch path of RoutingCounter.publish inside a CUDA graph: each replay publishes its
    # rows with the generation stamped before it; the host reads layer 0's row while the
    # replay still sleeps before layer 1's observe.
    counter = RoutingCounter(2, 16, "cuda")
    counter.publish()
    ids = torch.tensor([[3, 5], [5, 9]], device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        counter.observe(0, ids)
        torch.cuda._sleep(SLEEP_CYCLES)
        counter.observe(1, ids + 1)
    counter.clear()
    torch.cuda.synchronize()
    gen = counter.begin_forward()
    graph.replay()
    row0 = None
    while row0 is None:
        row0 = counter.published(0, gen)
    assert counter.published(1, gen) is None  # still sleeping before layer 1
    assert row0 == counter.counts[0].tolist()  # (this read waits for the replay)
    assert counter.published(1, gen) == counter.counts[1].tolist()
    assert sorted(e for e, c in enumerate(row0) if c) == [3, 5, 9]


def test_a_captured_wait_for_landing_waits_at_each_replay_for_the_loads_before_its_launch():
    # wait_for_landing inside a CUDA graph is a wait on the layer's external event: each
    # replay waits for the loads issued before it was launched (the copy stream sleeps first,
    # so they land late); a graph without the wait reads the map before they land.
    store, ref = build_store(2, 6, LAYOUT, seed=8)
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
