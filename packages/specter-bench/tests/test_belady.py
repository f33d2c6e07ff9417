"""Belady bound and policy comparison against a direct farthest-in-future simulation."""

import random

import pytest
import torch

from specter_bench.belady import (
    belady_bound,
    measure_expert_transfer_s,
    policy_hit_rates,
    warm_belady_loads,
)
from specter_cache import ExpertLayout, ExpertStore


def _farthest_in_future(sequence: list[int], slots: int) -> int:
    """Classic Belady on single-expert steps, starting with the first distinct experts free."""
    resident: set[int] = set()
    for e in sequence:  # free warm start: the first `slots` distinct experts
        if len(resident) < slots:
            resident.add(e)
    loads = 0
    for t, e in enumerate(sequence):
        if e in resident:
            continue
        loads += 1
        if len(resident) >= slots:
            rest = sequence[t + 1 :]
            next_use = {x: rest.index(x) if x in rest else len(rest) for x in resident}
            resident.remove(max(sorted(resident), key=next_use.__getitem__))
        resident.add(e)
    return loads


@pytest.mark.parametrize("seed", range(6))
def test_warm_belady_equals_farthest_in_future_on_single_expert_steps(seed):
    rng = random.Random(seed)
    slots = rng.randint(1, 4)
    sequence = [rng.randrange(7) for _ in range(40)]
    trace = [[frozenset([e]) for e in sequence]]
    assert warm_belady_loads(trace, slots) == _farthest_in_future(sequence, slots)


def _routing(seed, T, L, k, E):
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T * L)]).view(T, L, k)


def test_belady_bound_scales_loads_by_transfer_time_per_token():
    routing = _routing(1, T=30, L=3, k=2, E=10)
    bound = belady_bound(routing, [4, 5, 6], expert_transfer_s=0.002)
    assert bound.slots_per_layer == [4, 5, 6]
    assert bound.accesses == 30 * 3 * 2
    assert bound.generated_tokens == 30
    assert bound.tpot_ms == pytest.approx(1e3 * bound.loads * 0.002 / 30)
    # More slots never need more loads; all experts resident needs none after the warm start.
    more = belady_bound(routing, [5, 6, 7], expert_transfer_s=0.002)
    assert more.loads <= bound.loads
    assert belady_bound(routing, 10, expert_transfer_s=0.002).loads == 0
    with pytest.raises(ValueError, match="expert_transfer_s"):
        belady_bound(routing, 4, expert_transfer_s=0.0)
    with pytest.raises(ValueError, match="one per MoE layer"):
        belady_bound(routing, [4, 4], expert_transfer_s=1.0)


def test_policies_never_beat_belady_and_a_perfect_draft_prefetches_everything():
    target = _routing(2, T=48, L=2, k=2, E=12)
    # Each step of 3 tokens needs at most 6 experts: they fit the 6 slots.
    rates = policy_hit_rates(target, 6, draft_routing=target, window=3)
    assert set(rates) == {"lru", "lfu", "predictive", "belady"}
    accesses = rates["belady"]["accesses"]
    for name in ("lru", "lfu", "predictive"):
        assert rates[name]["accesses"] == accesses
        assert rates[name]["loads"] >= rates["belady"]["loads"]
    # The draft routed exactly as the target: every needed expert was prefetched in time.
    assert rates["predictive"]["hit_rate"] == 1.0
    assert rates["lru"]["hit_rate"] < 1.0
    no_draft = policy_hit_rates(target, 6)
    assert set(no_draft) == {"lru", "lfu", "belady"}
    with pytest.raises(ValueError, match="must match target routing"):
        policy_hit_rates(target, 5, draft_routing=target[:10])


def test_pinned_entries_sit_beside_belady_at_the_pinned_slots():
    # With a pinned configuration (its own slots), the replay adds Belady at those slots,
    # warm-started as the bound is: never more loads than the pinned LRU, and the bound's
    # own count at window 1.
    target = _routing(3, T=60, L=2, k=2, E=12)
    hot = [[0, 1, 2], [3, 4, 5]]
    rates = policy_hit_rates(target, 4, window=1, pinned=hot, pinned_slots=6)
    at_pins = rates["belady_pinned_slots"]
    assert at_pins["loads"] <= rates["pinned"]["loads"]
    assert at_pins["accesses"] == rates["pinned"]["accesses"] == rates["belady"]["accesses"]
    assert at_pins["loads"] == belady_bound(target, 6, expert_transfer_s=1.0).loads
    assert at_pins["warm_start"] is True
    assert "belady_pinned_slots" not in policy_hit_rates(target, 4)
    with pytest.raises(ValueError, match="one per MoE layer"):
        policy_hit_rates(target, 4, pinned=hot, pinned_slots=[6, 6, 6])


def test_measure_expert_transfer_time_on_cpu():
    layout = ExpertLayout({"w": ((64, 32), torch.float32), "b": ((64,), torch.float32)})
    store = ExpertStore(1, 3, layout, pin_memory=False)
    for e in range(3):
        store.put(0, e, {"w": torch.randn(64, 32), "b": torch.randn(64)})
    seconds = measure_expert_transfer_s(store, "cpu", repeats=5)
    assert 0 < seconds < 1.0
    with pytest.raises(ValueError, match="repeats"):
        measure_expert_transfer_s(store, "cpu", repeats=0)
