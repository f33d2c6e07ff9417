"""RoutingCounter: device counts equal a reference count; snapshots rank them."""

from collections import Counter

import pytest
import torch

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
