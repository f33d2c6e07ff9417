"""Saved costs: what AdaptiveDepth.export_costs writes, checked and read back by prime."""

import json

import pytest

from specter_spec import AdaptiveDepth, AdaptiveDepthConfig
from specter_spec.depth.saved_costs import read_saved_costs


def test_string_keys_as_json_writes_them_are_read_as_counts():
    costs = {
        "draft": {"2": 1e-3},
        "verify": {"1": 2e-3, "3": 4e-3, "4": None},
        "overhead": {"plain": 1e-4, "speculative": None},
        "steady_plain": 3e-3,
        "ages": {"draft": {"2": 5}, "verify": {"3": 1}, "steady_plain": 2},
    }
    saved = read_saved_costs(json.loads(json.dumps(costs)), max_depth=8)
    assert saved.draft == {2: 1e-3}
    assert saved.verify == {1: 2e-3, 3: 4e-3}  # None: not measured
    assert saved.draft_ages == {2: 5}
    assert saved.verify_ages == {3: 1}
    assert (saved.plain_overhead, saved.speculative_overhead) == (1e-4, None)
    assert (saved.steady_plain, saved.steady_plain_age) == (3e-3, 2)


@pytest.mark.parametrize(
    ("costs", "message"),
    [
        ([1, 2], "costs must be a mapping"),
        ({"draft": {"0": 1e-3}}, "count '0'; expected an int in \\[1, 8\\]"),
        ({"draft": {"9": 1e-3}}, "count '9'"),
        ({"verify": {"10": 1e-3}}, "count '10'; expected an int in \\[1, 9\\]"),
        ({"verify": {"x": 1e-3}}, "count 'x'"),
        ({"verify": {"2": -1.0}}, "finite number of seconds >= 0, got -1.0"),
        ({"verify": {"2": float("nan")}}, "got nan"),
        ({"draft": [1.0]}, "costs\\['draft'\\] must be a mapping"),
        ({"overhead": {"plain": "fast"}}, "overhead plain must be a finite number"),
        ({"steady_plain": True}, "steady_plain must be a finite number"),
        ({"ages": [1]}, "costs\\['ages'\\] must be a mapping"),
        ({"ages": {"verify": {"2": -1}}}, "must be an int >= 0 \\(iterations\\), got -1"),
        ({"ages": {"draft": {"x": 1}}}, "has count 'x'; expected an int"),
    ],
)
def test_priming_refuses_costs_it_cannot_use_and_changes_nothing(costs, message):
    with pytest.raises(ValueError, match=message):
        read_saved_costs(costs, max_depth=8)
    policy = AdaptiveDepth(AdaptiveDepthConfig(max_depth=8))
    with pytest.raises(ValueError, match=message):
        policy.prime(costs)
    assert policy.verify_costs == {}
    assert policy.draft_times == {}
    assert policy.choose_depth() == policy.config.initial_depth
