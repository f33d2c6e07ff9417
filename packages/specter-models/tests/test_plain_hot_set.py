"""A pinned hot set for plain decoding: chosen where pinning moves fewer experts than LRU
over the same slots, left out where it does not."""

from __future__ import annotations

import torch

from specter_models import choose_plain_hot_experts, plan_memory, preset_config

MODEL = "tiny-deepseek-v2"  # 8 routed experts a layer, top-2, 2 MoE layers
SLOTS = 4


def _budget(config, slots: int) -> float:
    """A budget whose draftless plan gives exactly ``slots`` slots a layer."""
    plan = plan_memory(config, slots_per_layer=slots, with_draft=False, dtype=torch.float32)
    return (plan.expected_peak_bytes + plan.num_moe_layers * plan.expert_bytes // 2) / 1e9


def _routing(rows: list[tuple[int, int]], layers: int = 2) -> torch.Tensor:
    """``[T, L, 2]``: the same two experts in every layer at each position."""
    ids = torch.tensor(rows, dtype=torch.long)
    return ids[:, None, :].expand(len(rows), layers, 2).contiguous()


def test_a_steady_core_among_one_off_experts_is_pinned():
    # Expert 0 every third token, between its uses a cycle over the seven others, longer
    # than the slots: LRU evicts 0 before it comes back; pinned, it stays.
    config = preset_config(MODEL)
    budget = _budget(config, SLOTS)
    assert plan_memory(config, budget, with_draft=False, dtype=torch.float32).slots_per_layer == 4
    cold = iter([1 + i % 7 for i in range(200)])
    rows = [(0, next(cold)) if t % 3 == 0 else (next(cold), next(cold)) for t in range(48)]
    routes = [_routing(rows[:24]), _routing(rows[24:])]
    choice = choose_plain_hot_experts(config, budget, routes, dtype=torch.float32)
    assert choice.slots_per_layer == SLOTS
    assert set(choice.loads) == {0, 1, 2, 3}  # every count that leaves an evictable slot
    assert choice.per_layer > 0
    assert choice.loads[choice.per_layer] < choice.loads[0]
    assert 0 in choice.hot_experts[0]
    assert 0 in choice.hot_experts[1]
    assert choice.window == 1
    assert choice.pruned_experts == []


def test_a_routing_that_moves_on_keeps_every_slot_evictable():
    # Each fold routes to experts the other fold never uses: a hot set counted on the other
    # fold only takes slots away, so none is pinned.
    config = preset_config(MODEL)
    budget = _budget(config, SLOTS)
    first = [(0, 1), (2, 3)] * 12
    second = [(4, 5), (6, 7)] * 12
    choice = choose_plain_hot_experts(
        config, budget, [_routing(first), _routing(second)], dtype=torch.float32
    )
    assert choice.per_layer == 0
    assert choice.hot_experts == [[], []]
    assert min(choice.loads.values()) == choice.loads[0]
    assert all(choice.loads[h] >= choice.loads[0] for h in choice.loads)


def test_no_budget_or_every_expert_resident_pins_nothing():
    config = preset_config(MODEL)
    routes = [_routing([(0, 1)] * 8)]
    for budget in (None, _budget(config, 8)):
        choice = choose_plain_hot_experts(config, budget, routes, dtype=torch.float32)
        assert (choice.per_layer, choice.loads) == (0, {})
