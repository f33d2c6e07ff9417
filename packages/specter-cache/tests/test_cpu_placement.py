"""The CPU-homed experts' cost model and choice, and the cache's exclusion of them."""

from __future__ import annotations

import pytest
import torch

from specter_cache import ExpertCache, ExpertLayout, RoutingCounter, SpeculativePrefetcher
from specter_cache.cpu_placement import PlacementCosts, choose_cpu_homed

MB = 1 << 20


def _costs(cpu_expert_ms: float, link_ms: float = 1.0, sync_ms: float = 0.0) -> PlacementCosts:
    return PlacementCosts(
        link_bytes_per_s=16 * MB / (link_ms / 1e3),
        cpu_expert_s=cpu_expert_ms / 1e3,
        cpu_row_s=cpu_expert_ms / 1e3,
        gpu_expert_s=0.0,
        sync_s=sync_ms / 1e3,
        expert_bytes=16 * MB,
        threads=4,
    )


def _skewed(experts: int = 8) -> list[float]:
    """Expert e routed in a share that halves with e: 0.9, 0.45, ..."""
    return [0.9 / 2**e for e in range(experts)]


def test_a_free_host_takes_every_miss_and_a_slow_one_none():
    freq = [_skewed()]
    fast = choose_cpu_homed(freq, 2, _costs(cpu_expert_ms=0.001))
    assert fast.homed == ((2, 3, 4, 5, 6, 7),)  # every expert beyond the 2 slots
    assert fast.host_ms[0] < fast.link_ms_without[0]
    slow = choose_cpu_homed(freq, 2, _costs(cpu_expert_ms=100.0))
    assert slow.homed == ((),)
    assert not slow.any
    assert slow.link_ms == slow.link_ms_without


def test_the_choice_balances_link_and_host_time():
    # Each miss costs 1 ms on the link and 1 ms on the host: the layer's finish time is
    # least where the two split the misses' expected cost about evenly.
    freq = [[0.5] * 8]
    placement = choose_cpu_homed(freq, 2, _costs(cpu_expert_ms=1.0))
    homed = len(placement.homed[0])
    assert 2 <= homed <= 4
    t = max(placement.link_ms[0], placement.host_ms[0])
    assert t < placement.link_ms_without[0]
    for n in (homed - 1, homed + 1):  # a count on either side is no better
        other = choose_cpu_homed(freq, 2, _costs(cpu_expert_ms=1.0), at_least=n)
        if len(other.homed[0]) == n:
            assert max(other.link_ms[0], other.host_ms[0]) >= t - 1e-9


def test_the_least_routed_are_homed_and_exclusions_stay_on_the_device():
    freq = [_skewed(), list(reversed(_skewed()))]
    placement = choose_cpu_homed(freq, 3, _costs(cpu_expert_ms=0.05), exclude=[[7], []])
    low, high = placement.homed
    assert 7 not in low
    assert low
    assert max(low) == 6
    assert high
    assert min(high) == 0
    assert set(high) <= {0, 1, 2, 3, 4}


def test_at_least_forces_homing_and_the_device_keeps_one_expert():
    freq = [_skewed(4)]
    forced = choose_cpu_homed(freq, 4, _costs(cpu_expert_ms=100.0), at_least=2)
    assert forced.homed == ((2, 3),)
    every = choose_cpu_homed(freq, 1, _costs(cpu_expert_ms=100.0), at_least=10)
    assert len(every.homed[0]) == 3  # E - 1


def test_more_rows_make_host_work_dearer():
    freq = [[0.2] * 16]
    one = choose_cpu_homed(freq, 4, _costs(cpu_expert_ms=0.6, sync_ms=0.05), rows=1)
    many = choose_cpu_homed(freq, 4, _costs(cpu_expert_ms=0.6, sync_ms=0.05), rows=8)
    assert one.rows == 1
    assert many.rows == 8
    assert one.homed[0]
    assert many.homed[0]
    assert set(one.homed[0]) <= set(range(16))
    assert placement_dict_is_plain(many.as_dict())


def placement_dict_is_plain(d: dict) -> bool:
    import json

    return json.loads(json.dumps(d)) == d


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"frequencies": []}, "one non-empty list per layer"),
        ({"frequencies": [[1.5, 0.1]]}, r"in \[0, 1\]"),
        ({"rows": 0}, "rows must be an int >= 1"),
        ({"at_least": -1}, "at_least must be an int >= 0"),
        ({"exclude": [[9]]}, "exclude needs one list"),
        ({"slots_per_layer": [1, 2]}, "one value per layer"),
    ],
)
def test_bad_input_is_refused(kwargs, match):
    args = {"frequencies": [[0.5, 0.1]], "slots_per_layer": 1, "costs": _costs(1.0)}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        choose_cpu_homed(**args)


def test_costs_are_checked():
    with pytest.raises(ValueError, match="link_bytes_per_s must be > 0"):
        PlacementCosts(0.0, 1e-3, 1e-3, 0.0, 0.0, 1, 1)
    costs = _costs(2.0)
    assert costs.cpu_seconds(0) == 0.0
    assert costs.cpu_seconds(3) == pytest.approx(6e-3)
    assert costs.cpu_seconds(1, 8 * MB) == pytest.approx(1e-3)


LAYOUT = ExpertLayout({"w": ((4, 4), torch.float32)})


def test_the_cache_never_loads_host_experts(make_store):
    store, _ = make_store(2, 8, LAYOUT)
    cache = ExpertCache(store, slots_per_layer=4, device="cpu", policy="predictive")
    cache.set_host_experts([[5, 6], []])
    assert cache.host_experts == (frozenset({5, 6}), frozenset())
    cache.prefetch({0: [6, 1, 5, 2], 1: [6]})
    assert sorted(cache.resident_experts(0)) == [1, 2]
    assert cache.resident_experts(1) == [6]
    with pytest.raises(ValueError, match=r"experts \[5\] are computed on the host"):
        cache.pin(0, [5])
    cache.pin(1, [3])
    with pytest.raises(ValueError, match=r"experts \[3\] are pinned"):
        cache.set_host_experts([[], [3]])
    with pytest.raises(ValueError, match="one list of expert ids"):
        cache.set_host_experts([[8], []])
    cache.set_host_experts(None)
    assert not any(cache.host_experts)


def test_the_draft_plan_prefetches_device_experts_only(make_store):
    store, _ = make_store(1, 8, LAYOUT)
    cache = ExpertCache(store, slots_per_layer=4, device="cpu", policy="predictive")
    cache.set_host_experts([[0, 1]])
    counter = RoutingCounter(1, 8, "cpu")
    prefetcher = SpeculativePrefetcher(cache, counter, pipelined=False)
    prefetcher.on_draft_start(2)
    for index in range(2):
        counter.observe(0, torch.tensor([[0, 1], [1, 2]]))
        prefetcher.on_draft_token(index)
    prefetcher.on_verify_start(3)
    assert set(cache.resident_experts(0)) == {2}
    assert cache.stats()["total"]["prefetch_loads"] == 1
