"""Plots: valid PNG files, and the plotted values are the records' values."""

import math

import pytest

from bench_fixtures import experiment_records, tpot_records
from specter_bench.bench_record import budget_label
from specter_bench.plots import (
    plot_depth_sweep,
    plot_policy_hit_rate,
    plot_tpot_per_system,
    plot_working_set,
    save_png,
)
from specter_bench.tables import summarize_tpot

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _bars(ax):
    """label -> bar heights of a grouped bar chart."""
    return {c.get_label(): [p.get_height() for p in c.patches] for c in ax.containers}


def _same(a, b):
    return all(
        (x is None and math.isnan(y)) or (x is not None and y == pytest.approx(x))
        for x, y in zip(a, b, strict=True)
    )


def test_tpot_plot_draws_each_systems_mean(tmp_path):
    records = tpot_records(seed=21)
    fig = plot_tpot_per_system(records)
    summaries = summarize_tpot(records)
    assert [ax.get_title() for ax in fig.axes] == ["deepseek-v2-lite", "qwen1.5-moe"]
    for ax in fig.axes:
        mine = [s for s in summaries if s.model == ax.get_title()]
        budgets = [16.0, 24.0, None]
        assert [t.get_text() for t in ax.get_xticklabels()] == [budget_label(b) for b in budgets]
        bars = _bars(ax)
        assert list(bars) == ["hf", "lru", "spec-lru", "specter"]
        for system, heights in bars.items():
            index = {s.budget_gb: s.tpot_ms for s in mine if s.system == system}
            assert _same([index.get(b) for b in budgets], heights)
    path = save_png(fig, tmp_path / "plots" / "tpot.png")
    data = path.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    assert len(data) > 1000


def test_experiment_plots_draw_the_given_points(tmp_path):
    records = experiment_records(seed=22)
    fig = plot_working_set(records)
    for ax in fig.axes:
        rec = next(
            r for r in records if r["kind"] == "working_set" and r["model"] == ax.get_title()
        )
        (line,) = ax.get_lines()
        assert list(line.get_xdata()) == [p["depth"] for p in rec["data"]["curve"]]
        assert list(line.get_ydata()) == pytest.approx([p["mean"] for p in rec["data"]["curve"]])

    fig = plot_policy_hit_rate(records)
    for ax in fig.axes:
        bars = _bars(ax)
        assert list(bars) == ["lru", "lfu", "predictive", "belady"]
        for i, budget in enumerate((16.0, 24.0)):
            rec = next(
                r
                for r in records
                if r["kind"] == "policy_hit_rate"
                and r["model"] == ax.get_title()
                and r["budget_gb"] == budget
                and r["data"]["window"] == 9  # the speculation window is drawn
            )
            for policy, heights in bars.items():
                assert heights[i] == pytest.approx(
                    100 * rec["data"]["policies"][policy]["hit_rate"]
                )

    fig = plot_depth_sweep(records)
    for ax in fig.axes:
        labelled = [ln for ln in ax.get_lines() if not ln.get_label().startswith("_")]
        assert [ln.get_label() for ln in labelled] == ["16 GB", "24 GB"]
        for ln, budget in zip(labelled, (16.0, 24.0), strict=True):
            rec = next(
                r
                for r in records
                if r["kind"] == "depth_sweep"
                and r["model"] == ax.get_title()
                and r["budget_gb"] == budget
            )
            points = sorted(rec["data"]["points"], key=lambda p: p["depth"])
            assert list(ln.get_ydata()) == pytest.approx([p["tpot_ms"] for p in points])
        path = save_png(fig, tmp_path / "depth.png")
        assert path.read_bytes().startswith(PNG_SIGNATURE)


def test_plots_without_data_say_so():
    with pytest.raises(ValueError, match="no data to plot"):
        plot_working_set(tpot_records(seed=23))
