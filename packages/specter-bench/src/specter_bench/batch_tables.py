"""The ``batch`` experiment's tables: mean TPOT and throughput against the batch size B per
system, and its throughput targets (``target_tables.BATCH_TARGETS``), met or not.

A cell is one (model, budget, system, B) of one ``specter bench`` process; its repeated runs
(``--runs``) each have one ``batch`` record. The cell's throughput and mean TPOT are the
medians over its runs; a throughput ratio of two cells of one process is computed run by run
(run i over run i), and a target ``ratio >= limit`` is met only where it holds at the worst
run (the smallest ratio).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from specter_bench.bench_record import budget_label
from specter_bench.table_format import (
    budget_key,
    markdown_table,
    mean_or_none,
    model_label,
    run_label,
    source_label,
    system_order,
    with_record_runs,
)
from specter_bench.target_tables import BATCH_TARGETS, BatchTarget, untargeted_high_budgets

__all__ = [
    "BatchSummary",
    "batch_table",
    "batch_targets_table",
    "evaluate_batch_targets",
    "summarize_batch",
]


@dataclass(frozen=True)
class BatchSummary:
    """One cell of the batch table: a system at a batch size, in one run.

    Attributes:
        throughput_by_run, tpot_by_run: ``{run_index: figure}`` of its repeated runs
            (decode throughput in tokens/s; mean TPOT per sequence in ms).
        throughput, mean_tpot_ms: their medians.
        distinct_target, distinct_draft: the engine's distinct experts per MoE layer per
            step, mean over the runs (None where not reported: transformers, no draft).
        speculation: what the engine said of speculation (joined when the runs differ).
        checked, matches: sequences compared with the prompt's reference decode (the first
            system to decode it) and how many equal it; ``engine_*`` the same against the
            first engine system's.
        record: one of the cell's records (its run and source label the row).
    """

    model: str
    budget_gb: float | None
    system: str
    batch_size: int
    run: str
    source: str
    throughput_by_run: dict[int, float] = field(hash=False)
    tpot_by_run: dict[int, float] = field(hash=False)
    throughput: float | None
    mean_tpot_ms: float | None
    end_to_end_tok_s: float | None
    distinct_target: float | None
    distinct_draft: float | None
    acceptance_rate: float | None
    mean_depth: float | None
    speculation: str | None
    checked: int
    matches: int
    engine_checked: int
    engine_matches: int
    peak_gpu_memory_gb: float | None
    record: dict[str, Any] = field(hash=False, compare=False)

    @property
    def throughput_range(self) -> str:
        """``"min-max (N runs)"`` of the runs' throughputs, ``"-"`` with one run."""
        values = list(self.throughput_by_run.values())
        if len(values) < 2:
            return "-"
        return f"{min(values):.1f}-{max(values):.1f} ({len(values)} runs)"


def _median(values: Iterable[float]) -> float | None:
    kept = list(values)
    return statistics.median(kept) if kept else None


def _by_run(records: Sequence[dict[str, Any]], key: str) -> dict[int, float]:
    out = {}
    for r in records:
        value = r["data"].get(key)
        if value is not None:
            out[int(r["data"].get("run_index") or 0)] = float(value)
    return dict(sorted(out.items()))


def summarize_batch(records: Iterable[dict[str, Any]]) -> list[BatchSummary]:
    """Group ``batch`` records by (model, budget, system, B, run); sorted by model, budget
    (unlimited last), system order and B."""
    groups: dict[tuple[str, float | None, str, int, str], list[dict[str, Any]]]
    groups = defaultdict(list)
    for r in records:
        if r.get("kind") == "batch":
            data = r["data"]
            key = (model_label(r), r.get("budget_gb"), data["system"], int(data["batch_size"]))
            groups[(*key, run_label(r))].append(r)
    out = []
    order = sorted(
        groups.items(),
        key=lambda kv: (kv[0][0], budget_key(kv[0][1]), system_order(kv[0][2]), kv[0][3:]),
    )
    for (model, budget, system, size, run), rs in order:
        data = [r["data"] for r in rs]
        throughputs = _by_run(rs, "throughput_tok_s")
        tpots = _by_run(rs, "mean_tpot_ms")
        said = sorted({str(d["speculation"]) for d in data if d.get("speculation")})
        peaks = [d["peak_gpu_memory_gb"] for d in data if d.get("peak_gpu_memory_gb")]
        out.append(
            BatchSummary(
                model=model,
                budget_gb=budget,
                system=system,
                batch_size=size,
                run=run,
                source=", ".join(sorted({source_label(r) for r in rs} - {""})),
                throughput_by_run=throughputs,
                tpot_by_run=tpots,
                throughput=_median(throughputs.values()),
                mean_tpot_ms=_median(tpots.values()),
                end_to_end_tok_s=mean_or_none(d.get("end_to_end_tok_s") for d in data),
                distinct_target=mean_or_none(d.get("distinct_experts_target") for d in data),
                distinct_draft=mean_or_none(d.get("distinct_experts_draft") for d in data),
                acceptance_rate=mean_or_none(d.get("acceptance_rate") for d in data),
                mean_depth=mean_or_none(d.get("mean_depth") for d in data),
                speculation="; ".join(said) or None,
                checked=sum(int(d.get("sequences_checked") or 0) for d in data),
                matches=sum(int(d.get("sequences_matching_reference") or 0) for d in data),
                engine_checked=sum(int(d.get("sequences_checked_engine") or 0) for d in data),
                engine_matches=sum(
                    int(d.get("sequences_matching_engine_reference") or 0) for d in data
                ),
                peak_gpu_memory_gb=max(peaks, default=None),
                record=rs[0],
            )
        )
    return out


def _index(summaries: Iterable[BatchSummary]) -> dict[tuple, dict[str, BatchSummary]]:
    """``{(model, budget, system, B): {run: summary}}``."""
    index: dict[tuple, dict[str, BatchSummary]] = defaultdict(dict)
    for s in summaries:
        index[(s.model, s.budget_gb, s.system, s.batch_size)][s.run] = s
    return index


def _ratio(mine: BatchSummary | None, ref: BatchSummary | None) -> float | None:
    if mine is None or ref is None or mine.throughput is None or not ref.throughput:
        return None
    return mine.throughput / ref.throughput


def _matched(count: int, checked: int) -> str:
    return f"{count}/{checked}" if checked else "-"


def batch_table(records: Iterable[dict[str, Any]]) -> str:
    """Mean TPOT, throughput, its scaling over B = 1 and over ``offload``, distinct experts
    per layer per step, acceptance and speculation, per model x budget x system x B."""
    summaries = summarize_batch(records)
    index = _index(summaries)
    rows, row_records = [], []
    for s in summaries:
        one = index.get((s.model, s.budget_gb, s.system, 1), {}).get(s.run)
        offload = index.get((s.model, s.budget_gb, "offload", s.batch_size), {}).get(s.run)
        rows.append(
            [
                s.model,
                budget_label(s.budget_gb),
                s.system,
                s.batch_size,
                s.mean_tpot_ms,
                s.throughput,
                s.throughput_range,
                _ratio(s, one),
                _ratio(s, offload) if s.system != "offload" else None,
                s.distinct_target,
                s.distinct_draft,
                s.acceptance_rate,
                s.mean_depth,
                s.speculation or "-",
                _matched(s.matches, s.checked),
                _matched(s.engine_matches, s.engine_checked),
                s.peak_gpu_memory_gb,
            ]
        )
        row_records.append(s.record)
    headers = [
        "model", "budget", "system", "B", "mean TPOT ms", "tokens/s", "tokens/s range",
        "x B=1", "/ offload", "experts/layer/step", "draft experts/layer/step", "acceptance",
        "depth", "speculation", "= ref", "= engine", "peak GB",
    ]  # fmt: skip
    headers, rows = with_record_runs(headers, rows, row_records)
    return markdown_table(headers, rows)


def _cells(target: BatchTarget, model: str, index: dict) -> list[tuple[int | None, dict, dict]]:
    """``(B, mine by run, versus by run)`` of each cell ``target`` names for ``model``."""
    if target.batch_size is not None:
        sizes = [target.batch_size]
    else:
        sizes = sorted(
            b
            for (m, budget, system, b) in index
            if m == model and budget == target.budget_gb and system == target.system
        )
    if not sizes:  # nothing measured: one row says so
        return [(target.batch_size, {}, {})]
    cells = []
    for size in sizes:
        other = target.versus_batch_size or size
        mine = index.get((model, target.budget_gb, target.system, size), {})
        ref = index.get((model, target.budget_gb, target.versus, other), {})
        cells.append((size, mine, ref))
    return cells


def _elsewhere(summaries: Sequence[BatchSummary], targets: Sequence[BatchTarget]) -> list:
    """The targets' ratios for models without targets, at their largest finite budget."""
    out = []
    for model, high in untargeted_high_budgets(summaries, targets):
        for t in targets:
            out.append(
                replace(
                    t, limit=float("nan"), limit_text="(no target)", budget_gb=high, model=model
                )
            )
    return out


def evaluate_batch_targets(
    records: Iterable[dict[str, Any]], targets: Sequence[BatchTarget] = BATCH_TARGETS
) -> list[dict[str, Any]]:
    """Each batch target cell: its throughput ratio, whether it is met, and what the engine
    said of speculation.

    Both sides come from the latest run that measured both (else the latest of each:
    ``same_run`` False). Where that run repeated its passes, the ratio is computed run by run
    (``per_run``), ``ratio`` is their median and a cell is met only at the worst (smallest).

    Returns:
        One dict per cell: ``model``, ``budget``, ``batch_size``, ``target`` (text),
        ``throughput``, ``versus_throughput``, ``ratio`` and ``met`` (None when a side was not
        measured or without a target), ``per_run``, ``same_run``, ``speculation`` and
        ``acceptance_rate`` of the target's system at that B.
    """
    summaries = summarize_batch(records)
    index = _index(summaries)
    out = []
    for t in [*targets, *_elsewhere(summaries, targets)]:
        models = [t.model] if t.model is not None else sorted({s.model for s in summaries})
        for model in models:
            for size, mine_runs, ref_runs in _cells(t, model, index):
                shared = sorted(set(mine_runs) & set(ref_runs))
                if shared:
                    mine, ref, same = mine_runs[shared[-1]], ref_runs[shared[-1]], True
                else:
                    mine = mine_runs[max(mine_runs)] if mine_runs else None
                    ref = ref_runs[max(ref_runs)] if ref_runs else None
                    same = mine is None or ref is None
                ratio = _ratio(mine, ref)
                paired: dict[int, float] = {}
                if same and mine is not None and ref is not None:
                    both = set(mine.throughput_by_run) & set(ref.throughput_by_run)
                    paired = {
                        i: mine.throughput_by_run[i] / ref.throughput_by_run[i]
                        for i in sorted(both)
                        if ref.throughput_by_run[i]
                    }
                    if len(paired) > 1:
                        ratio = statistics.median(paired.values())
                    else:
                        paired = {}
                has_limit = ratio is not None and t.limit == t.limit
                worst = min(paired.values()) if paired else ratio
                out.append(
                    {
                        "model": model,
                        "budget": budget_label(t.budget_gb),
                        "batch_size": size,
                        "target": t.name_at(size),
                        "throughput": mine.throughput if mine is not None else None,
                        "versus_throughput": ref.throughput if ref is not None else None,
                        "ratio": ratio,
                        "met": (worst >= t.limit) if has_limit else None,
                        "per_run": paired,
                        "same_run": same,
                        "speculation": mine.speculation if mine is not None else None,
                        "acceptance_rate": mine.acceptance_rate if mine is not None else None,
                    }
                )
    return out


def _status(cell: dict[str, Any]) -> str:
    if cell["ratio"] is None:
        return "not measured"
    runs = "" if cell["same_run"] else " (two runs)"
    if cell["met"] is None:
        return "-" + runs
    verdict = "met" if cell["met"] else "NOT met"
    if cell["per_run"]:
        return f"{verdict} at the worst of {len(cell['per_run'])} runs"
    return verdict + runs


def batch_targets_table(
    records: Iterable[dict[str, Any]], targets: Sequence[BatchTarget] = BATCH_TARGETS
) -> str:
    """Every batch target cell, met or not, with the speculation and acceptance of the
    target's system at that batch size."""
    cells = evaluate_batch_targets(records, targets)
    rows = [
        [
            c["model"],
            c["budget"],
            c["batch_size"],
            c["target"],
            c["throughput"],
            c["versus_throughput"],
            c["ratio"],
            (
                ", ".join(f"{r:.2f}" for r in c["per_run"].values())
                + f" (worst {min(c['per_run'].values()):.2f})"
                if c["per_run"]
                else "-"
            ),
            _status(c),
            c["acceptance_rate"],
            c["speculation"] or "-",
        ]
        for c in cells
    ]
    headers = [
        "model", "budget", "B", "target", "tokens/s", "versus tokens/s", "ratio",
        "per run (worst)", "status", "acceptance", "speculation",
    ]  # fmt: skip
    return markdown_table(headers, rows)
