"""Belady's bound against an exhaustive search over every schedule of the cache's model."""

import itertools
import random

import pytest

from specter_cache import belady_loads
from specter_cache.belady import belady_layer_loads


def exhaustive_min_loads(steps, slots):
    """Fewest loads over all schedules (dynamic programming over cache contents).

    A step needing R from cache C costs |R - C| loads. When R fits, R is resident together
    with at most ``slots - |R|`` experts kept from C - R, and the step may end in any subset of
    that. When R does not fit, it may end in any C' within C | R of at most ``slots`` experts,
    keeping at most ``slots - 1`` experts of C when a loaded expert passes through a slot.
    """
    states = {frozenset(): 0}
    for needed in steps:
        needed = frozenset(needed)
        nxt = {}
        for cache, cost in states.items():
            missing = needed - cache
            total = cost + len(missing)
            if len(needed) <= slots:
                others = sorted(cache - needed)
                for k in range(min(slots - len(needed), len(others)) + 1):
                    for extra in itertools.combinations(others, k):
                        during = needed | frozenset(extra)
                        for j in range(len(during) + 1):
                            for end in itertools.combinations(sorted(during), j):
                                end = frozenset(end)
                                nxt[end] = min(nxt.get(end, total), total)
            else:
                pool = sorted(cache | needed)
                for k in range(min(slots, len(pool)) + 1):
                    for end in itertools.combinations(pool, k):
                        end = frozenset(end)
                        if missing - end and len(end & cache) > slots - 1:
                            continue
                        nxt[end] = min(nxt.get(end, total), total)
        states = nxt
    return min(states.values())


def _random_steps(rng, fit):
    experts = rng.randint(2, 6)
    slots = rng.randint(1, 3)
    top = min(slots if fit else 4, experts)
    steps = [set(rng.sample(range(experts), rng.randint(1, top))) for _ in range(rng.randint(1, 7))]
    return steps, slots


@pytest.mark.parametrize("seed", range(120))
def test_belady_is_exact_when_every_step_fits(seed):
    steps, slots = _random_steps(random.Random(seed), fit=True)
    assert belady_layer_loads(steps, slots) == exhaustive_min_loads(steps, slots)


@pytest.mark.parametrize("seed", range(120))
def test_belady_is_a_lower_bound_when_steps_overflow(seed):
    steps, slots = _random_steps(random.Random(1000 + seed), fit=False)
    assert belady_layer_loads(steps, slots) <= exhaustive_min_loads(steps, slots)


def test_classic_paging_example():
    # Single requests: Belady's farthest-in-future rule. a b c a b with 2 slots: load a, b;
    # c evicts the one needed later (b), a hits, b loads again.
    assert belady_layer_loads([{0}, {1}, {2}, {0}, {1}], 2) == 4
    assert belady_layer_loads([{0}, {1}, {0}], 1) == 3


def test_belady_sums_layers_and_checks_arguments():
    trace = [[{0}, {1}, {0}], [{0, 1, 2}, {2}]]
    expect = belady_layer_loads(trace[0], 1) + belady_layer_loads(trace[1], 1)
    assert belady_loads(trace, 1) == expect
    expect = belady_layer_loads(trace[0], 2) + belady_layer_loads(trace[1], 1)
    assert belady_loads(trace, [2, 1]) == expect
    with pytest.raises(ValueError, match="positive int"):
        belady_layer_loads([{0}], 0)
    with pytest.raises(ValueError, match="one per layer"):
        belady_loads(trace, [1])
