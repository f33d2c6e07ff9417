"""Replacement policies: each picks the victim its rule names."""

import random

import pytest

from specter_cache import LFUPolicy, LRUPolicy, PredictivePolicy, ReplacementPolicy, make_policy


def _drive(policy, rng, layers=2, experts=8, events=60):
    """Random insert/access events; returns the reference last-use and frequency tables."""
    policy.reset(layers, experts)
    last, freq = {}, {}
    for clock in range(1, events + 1):
        layer, e = rng.randrange(layers), rng.randrange(experts)
        if rng.random() < 0.3:
            policy.on_insert(layer, e)
            freq[(layer, e)] = 0
        else:
            policy.on_access(layer, e)
            freq[(layer, e)] = freq.get((layer, e), 0) + 1
        last[(layer, e)] = clock
    return last, freq


@pytest.mark.parametrize("seed", range(10))
def test_lru_evicts_the_least_recently_touched(seed):
    rng = random.Random(seed)
    policy = LRUPolicy()
    last, _ = _drive(policy, rng)
    for layer in range(2):
        candidates = rng.sample(range(8), 4)
        expect = min(candidates, key=lambda e: (last.get((layer, e), -1), e))
        assert policy.choose_victim(layer, candidates) == expect


@pytest.mark.parametrize("seed", range(10))
def test_lfu_evicts_the_least_frequently_accessed_then_lru(seed):
    rng = random.Random(seed)
    policy = LFUPolicy()
    last, freq = _drive(policy, rng)
    for layer in range(2):
        candidates = rng.sample(range(8), 4)
        expect = min(
            candidates, key=lambda e: (freq.get((layer, e), 0), last.get((layer, e), -1), e)
        )
        assert policy.choose_victim(layer, candidates) == expect
    # Eviction forgets the frequency.
    policy.on_evict(0, candidates[0])
    assert policy._freq[0][candidates[0]] == 0


def test_predictive_keeps_the_plan_then_drops_its_lowest_rank():
    policy = PredictivePolicy()
    policy.reset(1, 8)
    for e in (0, 1, 2, 3, 4):
        policy.on_insert(0, e)
    policy.on_access(0, 0)  # 1 is now the least recently used
    policy.set_plan({0: [4, 1, 2]})
    assert policy.plan(0) == [4, 1, 2]
    assert policy.choose_victim(0, [0, 1, 2, 3, 4]) == 3  # unplanned, LRU among {0, 3}
    assert policy.choose_victim(0, [1, 2, 4]) == 2  # all planned: lowest rank goes
    policy.clear_plan()
    assert policy.choose_victim(0, [0, 1, 2, 3, 4]) == 1  # plain LRU


def test_make_policy():
    assert isinstance(make_policy("lru"), LRUPolicy)
    assert isinstance(make_policy("lfu"), LFUPolicy)
    custom = PredictivePolicy()
    assert make_policy(custom) is custom
    with pytest.raises(ValueError, match="unknown replacement policy 'fifo'"):
        make_policy("fifo")
    with pytest.raises(TypeError, match="ReplacementPolicy"):
        make_policy(3)
    assert issubclass(LRUPolicy, ReplacementPolicy)


class _FirstCandidate(ReplacementPolicy):
    """A policy with no ``choose_victims`` of its own: the base class's repeated choice."""

    def choose_victim(self, layer, candidates):
        return candidates[-1]


@pytest.mark.parametrize("name", ["lru", "lfu", "predictive", "custom"])
@pytest.mark.parametrize("seed", range(6))
def test_choose_victims_is_repeated_choose_victim(name, seed):
    # prepare_fills takes a layer's first victims at once; each policy's one sort must give
    # what choosing one victim at a time, without those chosen before, gives.
    rng = random.Random(seed)
    policy = _FirstCandidate() if name == "custom" else make_policy(name)
    L, E = 2, 12
    policy.reset(L, E)
    for _ in range(60):  # a random history of inserts, accesses, evictions and plans
        layer, expert = rng.randrange(L), rng.randrange(E)
        event = rng.random()
        if event < 0.3:
            policy.on_insert(layer, expert)
        elif event < 0.8:
            policy.on_access(layer, expert)
        elif event < 0.9:
            policy.on_evict(layer, expert)
        else:
            policy.set_plan({layer: rng.sample(range(E), rng.randrange(E))})
    for layer in range(L):
        candidates = rng.sample(range(E), rng.randrange(1, E))
        given = list(candidates)
        for count in (0, 1, 3, len(candidates), len(candidates) + 2):
            rest, expected = list(candidates), []
            while rest and len(expected) < count:
                victim = policy.choose_victim(layer, rest)
                rest.remove(victim)
                expected.append(victim)
            assert policy.choose_victims(layer, candidates, count) == expected
        assert candidates == given  # the caller's list is left as it was
