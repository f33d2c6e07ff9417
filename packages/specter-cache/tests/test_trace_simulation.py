"""Trace replay through the real cache: LRU matches a reference, Belady bounds every policy."""

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from specter_cache import belady_loads, simulate_policy
from specter_cache.trace_simulation import compare_policies


def reference_lru_loads(steps, slots):
    """Plain LRU for steps that fit the slots: hits touched, then misses evict the LRU expert."""
    stamp, cache, clock, loads = {}, set(), 0, 0
    for needed in steps:
        needed = sorted(set(needed))
        for e in needed:
            if e in cache:
                clock += 1
                stamp[e] = clock
        for e in needed:
            if e in cache:
                continue
            if len(cache) == slots:
                victim = min((x for x in cache if x not in needed), key=lambda x: (stamp[x], x))
                cache.remove(victim)
            cache.add(e)
            clock += 1
            stamp[e] = clock
            loads += 1
    return loads


@pytest.mark.parametrize("seed", range(20))
def test_lru_replay_matches_a_reference_lru(seed):
    rng = random.Random(seed)
    slots, experts = rng.randint(2, 5), rng.randint(4, 10)
    trace = [
        [set(rng.sample(range(experts), rng.randint(1, slots))) for _ in range(rng.randint(5, 30))]
        for _ in range(2)
    ]
    res = simulate_policy(trace, "lru", slots, num_experts=experts)
    assert res.demand_loads == sum(reference_lru_loads(steps, slots) for steps in trace)
    assert res.prefetch_loads == 0
    assert res.hits + res.demand_loads == res.accesses


def test_perfect_plans_turn_every_access_into_a_hit():
    rng = random.Random(7)
    trace = [[set(rng.sample(range(12), 3)) for _ in range(25)] for _ in range(3)]
    plans = [[sorted(s) for s in steps] for steps in trace]
    res = simulate_policy(trace, "predictive", 4, plans=plans)
    assert res.demand_loads == 0
    assert res.hits == res.accesses
    assert res.prefetch_used == res.prefetch_loads
    assert res.loads >= belady_loads(trace, 4)


def test_cyclic_trace_defeats_lru_but_not_belady():
    # S + 1 experts in a cycle: LRU always evicts the one needed next.
    trace = [[{i % 4} for i in range(40)]]
    out = compare_policies(trace, 3)
    assert out["lru"]["loads"] == 40
    assert out["belady"]["loads"] < out["lru"]["loads"]
    assert out["belady"]["loads"] == belady_loads(trace, 3)


traces = st.lists(
    st.lists(st.sets(st.integers(0, 7), min_size=1, max_size=5), min_size=1, max_size=12),
    min_size=1,
    max_size=2,
)


@settings(max_examples=40, deadline=None)
@given(trace=traces, slots=st.integers(1, 4), seed=st.integers(0, 10_000))
def test_belady_is_never_worse_than_any_policy(trace, slots, seed):
    rng = random.Random(seed)
    plans = [[rng.sample(range(8), rng.randint(0, slots)) for _ in steps] for steps in trace]
    out = compare_policies(trace, slots, plans=plans, num_experts=8)
    bound = out["belady"]["loads"]
    for name in ("lru", "lfu", "predictive"):
        assert bound <= out[name]["loads"], (name, out)


def test_simulation_rejects_bad_input():
    with pytest.raises(ValueError, match="no layers"):
        simulate_policy([], "lru", 2)
    with pytest.raises(ValueError, match="shape"):
        simulate_policy([[{0}]], "predictive", 2, plans=[[[0], [1]]])


def test_pinned_experts_are_hits_after_setup():
    # Expert 0 is needed every step; with it pinned LRU never reloads it even though the
    # other experts cycle through the one remaining slot.
    trace = [[[0, 1], [0, 2], [0, 3], [0, 1], [0, 2], [0, 3]]]
    plain = simulate_policy(trace, "lru", 2)
    pinned = simulate_policy(trace, "lru", 2, pinned=[[0]])
    assert pinned.accesses == plain.accesses == 12
    assert pinned.hits == 6  # every access of 0, none of the cycling ones
    assert pinned.loads == 6  # the pin's own load is setup, not counted
    assert plain.loads > pinned.loads
    with pytest.raises(ValueError, match="one list per layer"):
        simulate_policy(trace, "lru", 2, pinned=[[0], [1]])


def test_windowed_trace_groups_tokens_per_step():
    from specter_cache.trace_simulation import windowed_trace

    routing = torch.tensor([[[0, 1], [2, 3]], [[1, 4], [3, 3]], [[5, 0], [2, 2]]])  # [T=3, L=2, k]
    assert windowed_trace(routing, 1) == [
        [{0, 1}, {1, 4}, {0, 5}],
        [{2, 3}, {3}, {2}],
    ]
    assert windowed_trace(routing, 2) == [[{0, 1, 4}, {0, 5}], [{2, 3}, {2}]]  # partial tail
    with pytest.raises(ValueError, match="window must be an int >= 1"):
        windowed_trace(routing, 0)
    with pytest.raises(ValueError, match=r"\[T, L, k\]"):
        windowed_trace(routing[0], 1)
