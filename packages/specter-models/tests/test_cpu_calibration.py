"""The CPU expert path's calibration: measured costs, the placement, the per-run split."""

from __future__ import annotations

import pytest
import torch

from specter_models.cpu_calibration import (
    PLACEMENT_ROWS,
    choose_placement,
    cpu_experts_per_token,
    measure_placement_costs,
    placement_split,
    routing_frequencies,
)
from specter_models.loader import load_model


@pytest.fixture(scope="module")
def pinned_model():
    return load_model(
        "tiny-phimoe", device="cpu", dtype=torch.float32, slots_per_layer=3, hot_experts=[[0]] * 2
    )


def test_costs_are_measured_on_the_model_s_experts(pinned_model):
    costs = measure_placement_costs(pinned_model, threads=1, repeats=2)
    assert costs.threads == 1
    assert costs.expert_bytes == pinned_model.cache.store.expert_bytes(0)
    assert costs.cpu_expert_s > 0
    assert costs.link_bytes_per_s > 0
    assert costs.gpu_expert_s > 0
    assert costs.sync_s == 0.0  # no device to hand rows to
    assert torch.get_num_threads() == 1  # the conftest's count, given back


def test_the_placement_follows_the_routing_and_leaves_pinned_experts_alone(pinned_model):
    costs = measure_placement_costs(pinned_model, threads=1, repeats=1)
    E = pinned_model.cache.num_experts
    # [T, L, k]: layer 0 routes experts 0-2, layer 1 experts 0, 2 and 3; the others never.
    routing = torch.tensor([[[0, 1], [2, 3]], [[1, 2], [3, 0]]]).repeat(5, 1, 1)
    frequencies = routing_frequencies([routing], E)
    assert frequencies[0][:5] == [0.5, 1.0, 0.5, 0.0, 0.0]
    placement = choose_placement(pinned_model, costs, [routing], slots_per_layer=3, at_least=E)
    assert placement.rows == PLACEMENT_ROWS
    for layer, homed in enumerate(placement.homed):
        assert 0 not in homed  # pinned
        assert len(homed) == E - 1  # every expert but the pinned one, which the device keeps
        never = {e for e in range(E) if frequencies[layer][e] == 0}
        assert never <= set(homed)  # the unrouted ones first
    uniform = choose_placement(pinned_model, costs, None, slots_per_layer=3, at_least=2)
    assert uniform.homed == ((E - 2, E - 1),) * 2  # equal shares: the highest ids


def test_the_split_counts_each_need_once():
    cache = {"hits": 10, "prefetch_used": 4, "demand_loads": 2, "streamed_reads": 3}
    assert placement_split(cache, None) == {
        "resident": 6, "transferred": 6, "streamed": 3, "cpu": 0
    }  # fmt: skip
    assert cpu_experts_per_token(None, 5) is None
