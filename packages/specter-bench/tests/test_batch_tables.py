"""The batch experiment's table, targets and plot, from synthetic ``batch`` records."""

import pytest

from specter_bench.batch_tables import (
    batch_table,
    batch_targets_table,
    evaluate_batch_targets,
    summarize_batch,
)
from specter_bench.bench_record import ExperimentRecord
from specter_bench.plots import plot_batch

DSV2 = "deepseek-v2-lite"


def _record(model, system, size, throughput, *, run_index=0, budget=24.0, speculation=None):
    data = {
        "system": system,
        "batch_size": size,
        "run_index": run_index,
        "mean_tpot_ms": 1e3 * size / throughput,
        "throughput_tok_s": throughput,
        "distinct_experts_target": 6.0 * size if system != "hf" else None,
        "distinct_experts_draft": 5.0 * size if system == "specter" else None,
        "acceptance_rate": 0.8 if system == "specter" else None,
        "speculation": speculation,
        "sequences_checked": size,
        "sequences_matching_reference": size - 1 if system == "hf" else size,
    }
    identity = {"started_at": "2026-01-02T03:04:05", "git_commit": "abc1234"}
    return ExperimentRecord("batch", model, None if system == "hf" else budget, data,
                            identity).as_dict()  # fmt: skip


def _run(specter, offload, model=DSV2, **kwargs):
    """Records of specter and offload at B = 1, 2, 4, 8 with the given throughputs."""
    out = []
    for size, s, o in zip((1, 2, 4, 8), specter, offload, strict=True):
        out.append(_record(model, "specter", size, s, **kwargs))
        out.append(_record(model, "offload", size, o, **kwargs))
    return out


def test_the_table_quotes_scaling_and_the_ratio_to_offload():
    records = _run((100.0, 180.0, 300.0, 450.0), (80.0, 150.0, 200.0, 400.0))
    records.append(_record(DSV2, "hf", 4, 50.0))
    table = batch_table(records)
    # specter at B = 8: 450 tokens/s, 4.50 x its B = 1, 1.12 x offload's.
    row = next(line for line in table.splitlines() if "| specter | 8 |" in line)
    assert "| 450.00 |" in row
    assert "| 4.50 | 1.12 |" in row
    assert "| 48.00 | 40.00 |" in row  # distinct experts of the target and the draft
    hf = next(line for line in table.splitlines() if "| hf | 4 |" in line)
    assert "| unlimited |" in hf
    assert "| 3/4 |" in hf


def test_targets_are_met_or_not_per_batch_size():
    met = evaluate_batch_targets(_run((100.0, 180.0, 300.0, 450.0), (80.0, 150.0, 200.0, 400.0)))
    by = {(c["target"], c["batch_size"]): c for c in met}
    assert by[("specter B=8 / specter B=1 >= 4", 8)]["met"] is True
    assert by[("specter / offload >= 1.3", 4)]["ratio"] == pytest.approx(1.5)
    assert by[("specter / offload >= 1.3", 4)]["met"] is True
    every = [c for c in met if c["target"] == "specter / offload >= 1"]
    assert [c["batch_size"] for c in every] == [1, 2, 4, 8]
    assert all(c["met"] for c in every)

    slow = _run((100.0, 130.0, 210.0, 300.0), (120.0, 150.0, 200.0, 400.0))
    by = {(c["target"], c["batch_size"]): c for c in evaluate_batch_targets(slow)}
    assert by[("specter B=8 / specter B=1 >= 4", 8)]["met"] is False  # 3x
    assert by[("specter / offload >= 1.3", 4)]["met"] is False  # 1.05x
    assert by[("specter / offload >= 1", 1)]["met"] is False
    assert by[("specter / offload >= 1", 4)]["met"] is True
    table = batch_targets_table(slow)
    assert table.count("NOT met") == 5  # 3x, 1.05x at B=4, and below offload at B = 1, 2, 8


def test_a_target_holds_only_at_the_worst_run():
    records = _run((100.0, 180.0, 300.0, 450.0), (80.0, 150.0, 200.0, 400.0), run_index=0)
    records += _run((100.0, 180.0, 250.0, 450.0), (80.0, 150.0, 200.0, 400.0), run_index=1)
    cell = next(
        c for c in evaluate_batch_targets(records)
        if c["target"] == "specter / offload >= 1.3" and c["batch_size"] == 4
    )  # fmt: skip
    assert cell["per_run"] == {0: pytest.approx(1.5), 1: pytest.approx(1.25)}
    assert cell["met"] is False
    summary = next(
        s for s in summarize_batch(records) if s.system == "specter" and s.batch_size == 4
    )
    assert summary.throughput == pytest.approx(275.0)  # the median of the two runs
    assert summary.throughput_range == "250.0-300.0 (2 runs)"
    assert "NOT met at the worst of 2 runs" in batch_targets_table(records)


def test_models_without_targets_show_the_ratios_without_one():
    records = _run((10.0, 18.0, 30.0, 45.0), (8.0, 15.0, 20.0, 40.0), model="qwen1.5-moe",
                   budget=20.0)  # fmt: skip
    cells = [c for c in evaluate_batch_targets(records) if c["model"] == "qwen1.5-moe"]
    assert cells
    assert all(c["met"] is None for c in cells)
    assert {c["budget"] for c in cells} == {"20 GB"}
    assert next(c for c in cells if c["batch_size"] == 4 and "1.3" not in c["target"])
    dsv2 = [c for c in evaluate_batch_targets(records) if c["model"] == DSV2]
    assert all(c["ratio"] is None for c in dsv2)  # DeepSeek-V2-Lite's cells: not measured
    every = [c for c in dsv2 if c["target"] == "specter / offload >= 1"]
    assert [c["batch_size"] for c in every] == [None]  # one row for "every B", unmeasured
    assert batch_targets_table(records).count("not measured") == 3


def test_speculation_turned_off_is_quoted_beside_the_target():
    records = _run((100.0, 180.0, 300.0, 450.0), (80.0, 150.0, 200.0, 400.0))
    records.append(_record(DSV2, "specter", 16, 700.0, speculation="off (batch 16: ...)"))
    records.append(_record(DSV2, "offload", 16, 700.0))
    cell = next(
        c for c in evaluate_batch_targets(records)
        if c["target"] == "specter / offload >= 1" and c["batch_size"] == 16
    )  # fmt: skip
    assert cell["met"] is True
    assert cell["speculation"] == "off (batch 16: ...)"


def test_the_plot_draws_throughput_and_tpot_against_b(tmp_path):
    records = _run((100.0, 180.0, 300.0, 450.0), (80.0, 150.0, 200.0, 400.0))
    fig = plot_batch(records)
    rate, tpot = fig.axes[0], fig.axes[1]
    lines = {line.get_label(): line for line in rate.get_lines()}
    assert list(lines["specter"].get_xdata()) == [1, 2, 4, 8]
    assert list(lines["specter"].get_ydata()) == [100.0, 180.0, 300.0, 450.0]
    offload = next(line for line in tpot.get_lines() if line.get_label() == "offload")
    assert list(offload.get_ydata()) == pytest.approx([12.5, 1e3 * 2 / 150, 20.0, 20.0])
    with pytest.raises(ValueError, match="no data"):
        plot_batch([])
