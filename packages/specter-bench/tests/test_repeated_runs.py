"""Repeated runs: each run's TPOT, the median and range, and ratios judged at the worst run."""

import pytest

from specter_bench.repeated_runs import median_range, per_run, ratio_holds
from specter_bench.target_tables import Target


def test_each_run_is_the_median_over_its_prompts():
    records = [
        {"tpot_ms": 1.0, "run_index": 0},
        {"tpot_ms": 3.0, "run_index": 0},
        {"tpot_ms": 2.0, "run_index": 0},
        {"tpot_ms": 9.0, "run_index": 1},
        {"tpot_ms": None, "run_index": 1},
        {"tpot_ms": 4.0},  # written before repeated runs: run 0
    ]
    assert per_run(records) == {0: 2.5, 1: 9.0}
    assert median_range([3.0, 1.0, 2.0]) == (2.0, 1.0, 3.0)
    assert median_range([]) is None


def test_a_ratio_holds_only_at_its_worst_run():
    target = Target("specter", "offload", 0.7, "<= 0.7", 24.0)
    specter = {0: 6.0, 1: 6.5, 2: 7.5}
    offload = {0: 10.0, 1: 10.0, 2: 10.0}
    check = ratio_holds(target, specter, offload)
    assert check.ratios == pytest.approx({0: 0.6, 1: 0.65, 2: 0.75})
    assert check.worst == pytest.approx(0.75)
    assert check.median == pytest.approx(0.65)
    assert check.holds is False  # two of three runs meet it: not enough
    assert ratio_holds(0.8, specter, offload).holds is True  # a bare limit works too
    # Runs pair by index: a run one side lacks is left out, not matched to another.
    partial = ratio_holds(target, {0: 6.0, 2: 9.0}, {0: 10.0, 1: 1.0})
    assert partial.ratios == pytest.approx({0: 0.6})
    assert partial.holds is True
    # No pair, or no limit (a ratio quoted for information): no verdict.
    assert ratio_holds(target, {0: 1.0}, {1: 1.0}).holds is None
    assert ratio_holds(float("nan"), specter, offload).holds is None
