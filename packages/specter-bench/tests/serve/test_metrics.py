"""Figures the metrics take from a generation's statistics."""

from __future__ import annotations

import pytest

from specter_bench.serve.metrics import ServerMetrics, bytes_moved, draft_counts


def test_bytes_moved_from_the_count_or_the_per_token_figure():
    assert bytes_moved({"bytes_moved": 10}) == 10.0
    assert bytes_moved({"h2d_mb_per_token": 1.5, "new_tokens": 4}) == pytest.approx(6e6)
    assert bytes_moved({"h2d_mb_per_token": None, "new_tokens": 4}) is None


def test_draft_counts_from_the_counts_or_the_rates():
    assert draft_counts({"proposed": 8, "accepted": 6}) == (8.0, 6.0)
    stats = {"mean_depth": 3.25, "iterations": 4, "acceptance_rate": 12 / 13}
    assert draft_counts(stats) == (13.0, 12.0)
    assert draft_counts({"mean_depth": None, "iterations": 0, "acceptance_rate": None}) is None


def test_a_figure_the_engine_did_not_report_is_not_observed():
    metrics = ServerMetrics()
    metrics.observe_generation(
        queue_s=0.0, ttft_s=None, tpot_s=None, duration_s=0.1, prompt_tokens=2,
        completion_tokens=1, stats={"acceptance_rate": None, "hit_rate": 0.5},
    )  # fmt: skip
    text = metrics.exposition().decode()
    assert "specter_acceptance_rate_count 0.0" in text
    assert "specter_expert_cache_hit_rate_count 1.0" in text
    assert "specter_time_to_first_token_seconds_count 0.0" in text
