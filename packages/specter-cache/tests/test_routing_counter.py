"""RoutingCounter: device counts equal a reference count; snapshots rank them."""

from collections import Counter

import pytest
import torch

from cache_helpers import SLEEP_CYCLES, cuda
from specter_cache import RoutingCounter


def test_counts_equal_a_reference_count():
    g = torch.Generator().manual_seed(0)
    counter = RoutingCounter(num_layers=3, num_experts=10, device="cpu")
    reference = [Counter() for _ in range(3)]
    for _ in range(20):
        layer = int(torch.randint(0, 3, (1,), generator=g))
        ids = torch.randint(0, 10, (int(torch.randint(1, 6, (1,), generator=g)), 2), generator=g)
        if layer == 1:
            ids = ids.to(torch.int32)  # int32 ids work as well
        counter.observe(layer, ids)
        reference[layer].update(ids.flatten().tolist())
    for layer in range(3):
        expect = torch.tensor([reference[layer][e] for e in range(10)], dtype=torch.int32)
        assert torch.equal(counter.counts[layer], expect)
    assert counter.observations == 20


def test_observe_grows_past_its_ones_buffer():
    counter = RoutingCounter(1, 4, "cpu")
    ids = torch.randint(0, 4, (500, 3), generator=torch.Generator().manual_seed(1))
    counter.observe(0, ids)
    assert torch.equal(counter.counts[0], torch.bincount(ids.flatten(), minlength=4).int())


@pytest.mark.parametrize("seed", range(5))
def test_snapshot_ranks_the_most_used_experts(seed):
    g = torch.Generator().manual_seed(seed)
    counter = RoutingCounter(2, 12, "cpu")
    for layer in range(2):
        counter.observe(layer, torch.randint(0, 12, (40, 2), generator=g) % (5 + 4 * layer))
    plan = counter.snapshot([3, 6])
    for layer, top_m in ((0, 3), (1, 6)):
        counts = counter.counts[layer].tolist()
        chosen = plan[layer]
        nonzero = sum(c > 0 for c in counts)
        assert len(chosen) == min(top_m, nonzero)
        assert [counts[e] for e in chosen] == sorted((counts[e] for e in chosen), reverse=True)
        left_out = [counts[e] for e in range(12) if e not in chosen]
        assert max(left_out) <= min(counts[e] for e in chosen)
        assert all(counts[e] > 0 for e in chosen)


def test_snapshot_leaves_out_unused_experts_and_clear_resets():
    counter = RoutingCounter(2, 6, "cpu")
    counter.observe(0, torch.tensor([[4, 4], [4, 1]]))
    plan = counter.snapshot(4)
    assert plan == {0: [4, 1], 1: []}
    counter.clear()
    assert int(counter.counts.abs().sum()) == 0
    assert counter.observations == 0
    assert counter.snapshot(2) == {0: [], 1: []}


def test_bad_arguments_are_rejected():
    counter = RoutingCounter(2, 6, "cpu")
    with pytest.raises(ValueError, match="integer tensor"):
        counter.observe(0, torch.tensor([1.0]))
    with pytest.raises(ValueError, match="layer must be"):
        counter.observe(2, torch.tensor([1]))
    with pytest.raises(ValueError, match="router's device"):
        counter.observe(0, torch.tensor([1], device="meta"))
    with pytest.raises(ValueError, match="positive ints"):
        counter.snapshot(0)
    with pytest.raises(ValueError, match="one per layer"):
        counter.snapshot([1])
    with pytest.raises(ValueError, match="num_experts"):
        RoutingCounter(2, 0, "cpu")


def test_snapshot_async_keeps_the_counts_it_was_taken_at():
    counter = RoutingCounter(num_layers=2, num_experts=6, device="cpu")
    counter.observe(0, torch.tensor([[1, 3], [3, 5], [1, 3]]))  # 3: 3 times, 1: 2, 5: 1
    counter.observe(1, torch.tensor([[2, 2]]))
    expected = counter.snapshot([2, 3])
    pending = counter.snapshot_async([2, 3])
    counter.observe(0, torch.tensor([[4, 4], [4, 4]]))  # after the snapshot: not in it
    counter.clear()
    assert pending.done()
    assert pending.result() == expected == {0: [3, 1], 1: [2]}
    with pytest.raises(ValueError, match="top_m"):
        counter.snapshot_async([2])


def test_published_rows_carry_each_observe_counts_stamped_with_the_forward():
    counter = RoutingCounter(num_layers=3, num_experts=5, device="cpu")
    assert not counter.publishing
    counter.publish()
    assert counter.publishing
    first = counter.begin_forward()
    assert all(counter.published(layer, first) is None for layer in range(3))  # nothing yet
    counter.observe(0, torch.tensor([[1, 3], [3, 4]]))
    assert counter.published(0, first) == [0, 1, 0, 2, 1]
    assert counter.published(1, first) is None  # layer 1 not reached by this forward
    assert counter.published(0, first + 1) is None  # another forward's stamp
    second = counter.begin_forward()
    assert second == first + 1
    assert counter.published(0, second) is None  # layer 0's row is the last forward's
    counter.observe(0, torch.tensor([[3, 0]]))  # counts accumulate over a draft's forwards
    counter.observe(1, torch.tensor([[2, 2]]))
    assert counter.published(0, second) == [1, 1, 0, 3, 1]
    assert counter.published(1, second) == [0, 0, 2, 0, 0]
    assert [counter.published(layer, second) for layer in range(2)] == counter.counts[:2].tolist()


def test_a_row_only_partly_stamped_is_not_published():
    counter = RoutingCounter(num_layers=1, num_experts=4, device="cpu")
    counter.publish()
    gen = counter.begin_forward()
    counter.observe(0, torch.tensor([0, 2]))
    assert counter.published(0, gen) == [1, 0, 1, 0]
    counter._host[0, 3] = 7  # an entry still holding an older forward's stamp
    assert counter.published(0, gen) is None


def test_generations_cycle_and_stay_positive():
    counter = RoutingCounter(num_layers=1, num_experts=2, device="cpu")
    counter.publish()
    seen = [counter.begin_forward() for _ in range(2049)]
    assert (seen[0], seen[2046], seen[2047], seen[2048]) == (1, 2047, 1, 2)
    counter.observe(0, torch.tensor([1, 1, 1]))
    assert counter.published(0, seen[-1]) == [0, 3]
    assert int(counter._host.min()) >= 0


def test_a_publish_kernel_replaces_the_count_and_the_copy():
    counter = RoutingCounter(num_layers=2, num_experts=4, device="cpu")
    calls = []

    def kernel(counts_row, ids, stamp, address, host_row):
        calls.append((int(address), host_row.data_ptr()))
        counts_row.index_add_(0, ids.reshape(-1).long(), torch.ones_like(ids.reshape(-1)).int())
        host_row.copy_(counts_row + stamp)

    counter.publish(kernel)
    gen = counter.begin_forward()
    counter.observe(1, torch.tensor([[3, 0], [3, 1]]))
    assert counter.counts[1].tolist() == [1, 1, 0, 2]
    assert counter.published(1, gen) == [1, 1, 0, 2]
    assert calls == [(counter._host[1].data_ptr(), counter._host[1].data_ptr())]


def test_rank_orders_by_count_then_id_and_leaves_out_zeros():
    counter = RoutingCounter(num_layers=1, num_experts=6, device="cpu")
    assert counter.rank([0, 2, 5, 2, 0, 1], top_m=3) == [2, 1, 3]
    assert counter.rank([0, 2, 5, 2, 0, 1], top_m=10) == [2, 1, 3, 5]
    assert counter.rank([0] * 6, top_m=2) == []


def test_publishing_calls_need_publish_first():
    counter = RoutingCounter(num_layers=1, num_experts=2, device="cpu")
    with pytest.raises(RuntimeError, match="publish"):
        counter.begin_forward()
    with pytest.raises(RuntimeError, match="publish"):
        counter.published(0, 1)


@cuda
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


@cuda
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
