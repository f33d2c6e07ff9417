"""The pinned hot-set configuration the policy replay estimates."""

from types import SimpleNamespace

import pytest
import torch

from specter_bench.belady import policy_hit_rates
from specter_bench.pinned_draft import pinned_configuration
from specter_bench.routing_analysis import routing_trace
from specter_bench.tables import policy_table
from specter_cache import simulate_policy


def _plan(slots=4, experts=8, layers=2, expert_bytes=100, int4_bytes=40):
    return SimpleNamespace(
        slots_per_layer=slots, num_experts=experts, num_moe_layers=layers,
        expert_bytes=expert_bytes, draft_int4_bytes=int4_bytes * layers * experts,
    )  # fmt: skip


def _routes(counts_per_layer, k=2):
    """``[T, L, k]`` routing in which layer l routes to expert e counts[l][e] times."""
    ids = [[e for e, n in enumerate(counts) for _ in range(n)] for counts in counts_per_layer]
    length = len(ids[0])
    assert all(len(x) == length for x in ids)
    assert length % k == 0
    return torch.tensor(ids).T.reshape(length // k, k, len(ids)).permute(0, 2, 1).contiguous()


def test_pins_the_other_prompts_most_routed_experts_and_sizes_the_slots():
    a = _routes([[6, 0, 0, 0, 0, 2, 2, 2], [0, 0, 0, 0, 4, 4, 4, 0]])  # 12 pairs per layer
    b = _routes([[0, 5, 4, 3, 0, 0, 0, 0], [3, 3, 3, 0, 0, 0, 0, 3]])
    conf = pinned_configuration(_plan(), [a, b])
    assert conf.experts_per_layer == 3  # one fewer than the plan's 4 slots
    # 3 pinned experts free 3 x 40 INT4 bytes: one more 100-byte FP16 slot.
    assert conf.slots_per_layer == 5
    assert conf.hot_sets[0] == [[1, 2, 3], [0, 1, 2]]  # counted on b, for a
    assert conf.hot_sets[1] == [[0, 5, 6], [4, 5, 6]]  # counted on a (ties: lower id)


def test_no_configuration_where_it_cannot_apply():
    a = _routes([[6, 0, 0, 0, 0, 2, 2, 2], [0, 0, 0, 0, 4, 4, 4, 0]])
    assert pinned_configuration(_plan(), [a]) is None  # nothing else to count on
    assert pinned_configuration(_plan(slots=8), [a, a]) is None  # every expert resident
    assert pinned_configuration(_plan(int4_bytes=0), [a, a]) is None  # no INT4 draft
    with pytest.raises(ValueError, match=r"routing must be \[T, L=3, k\]"):
        pinned_configuration(_plan(layers=3), [a, a])


def test_the_replay_reports_pinned_beside_the_policies():
    g = torch.Generator().manual_seed(3)
    routes = torch.randint(0, 8, (24, 2, 2), generator=g)
    hot = [[0, 1, 2], [3, 4, 5]]
    rates = policy_hit_rates(routes, 4, window=2, num_experts=8, pinned=hot, pinned_slots=5)
    assert {"lru", "lfu", "belady", "pinned"} <= set(rates)
    direct = simulate_policy(routing_trace(routes, 2), "lru", 5, num_experts=8, pinned=hot)
    assert rates["pinned"] == direct.as_dict()
    assert "pinned" not in policy_hit_rates(routes, 4, window=2, num_experts=8)
    record = {
        "kind": "policy_hit_rate", "model": "m", "budget_gb": 24.0,
        "data": {"window": 2, "slots_per_layer": 4, "policies": rates,
                 "pinned": {"experts_per_layer": 3, "slots_per_layer": 5}},
    }  # fmt: skip
    table = policy_table([record])
    assert "pinned hit rate" in table
    assert "| 3 / 5 |" in table
    plain = {**record, "data": {**record["data"], "policies": {"lru": rates["lru"]}}}
    assert "pinned" not in policy_table([plain])
