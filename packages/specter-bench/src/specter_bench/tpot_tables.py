"""TPOT tables: the per-(model, budget, system, run) summary, TPOT per system, latency per
phase.

TPOT is the median over prompts, other columns are means; records of different runs
(processes) stay in separate rows.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from specter_bench.bench_record import budget_label
from specter_bench.table_format import (
    budget_key,
    markdown_table,
    mean_or_none,
    median_or_none,
    model_label,
    run_label,
    source_label,
    system_order,
)

__all__ = ["SystemSummary", "phase_table", "summarize_tpot", "tpot_table"]


@dataclass(frozen=True)
class SystemSummary:
    """One (model, budget, system) of one run over its prompts: the median TPOT, the other
    figures' means."""

    model: str
    budget_gb: float | None
    system: str
    prompts: int
    new_tokens: int
    tpot_ms: float | None
    tokens_per_s: float | None
    prefill_ms: float | None
    draft_ms_per_token: float | None
    verify_ms_per_token: float | None
    acceptance_rate: float | None
    accepted_per_iteration: float | None
    depth: float | None
    hit_rate: float | None
    prefetch_precision: float | None
    prefetch_recall: float | None
    h2d_mb_per_token: float | None
    stall_ms_per_token: float | None
    peak_gpu_memory_gb: float | None
    belady_tpot_ms: float | None
    tpot_over_belady: float | None
    checked: int
    mismatches: int
    engine_checked: int
    engine_mismatches: int
    notes: tuple[str, ...]
    run: str = ""
    source: str = ""


def summarize_tpot(records: Iterable[dict[str, Any]]) -> list[SystemSummary]:
    """Group ``tpot`` records by (model, budget, system, run) and summarise over prompts:
    the median TPOT, means of the rest. A replayed routing is part of the model's label
    (``table_format.model_label``).

    Rows come sorted by model, budget (unlimited last), the order of
    :data:`~specter_bench.bench_record.SYSTEM_NAMES` and run.
    """
    groups: dict[tuple[str, float | None, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        if r.get("kind") == "tpot":
            groups[(model_label(r), r["budget_gb"], r["system"], run_label(r))].append(r)
    out = []
    for (model, budget, system, run), rs in sorted(
        groups.items(),
        key=lambda kv: (kv[0][0], budget_key(kv[0][1]), system_order(kv[0][2]), kv[0][3]),
    ):
        h2d = mean_or_none(r.get("h2d_bytes_per_token") for r in rs)
        out.append(
            SystemSummary(
                model=model,
                budget_gb=budget,
                system=system,
                prompts=len(rs),
                new_tokens=sum(int(r.get("new_tokens") or 0) for r in rs),
                tpot_ms=median_or_none(r.get("tpot_ms") for r in rs),
                tokens_per_s=mean_or_none(r.get("tokens_per_s") for r in rs),
                prefill_ms=mean_or_none(r.get("prefill_ms") for r in rs),
                draft_ms_per_token=mean_or_none(r.get("draft_ms_per_token") for r in rs),
                verify_ms_per_token=mean_or_none(r.get("verify_ms_per_token") for r in rs),
                acceptance_rate=mean_or_none(r.get("acceptance_rate") for r in rs),
                accepted_per_iteration=mean_or_none(r.get("accepted_per_iteration") for r in rs),
                depth=mean_or_none(r.get("depth") for r in rs),
                hit_rate=mean_or_none(r.get("hit_rate") for r in rs),
                prefetch_precision=mean_or_none(r.get("prefetch_precision") for r in rs),
                prefetch_recall=mean_or_none(r.get("prefetch_recall") for r in rs),
                h2d_mb_per_token=None if h2d is None else h2d / 1e6,
                stall_ms_per_token=mean_or_none(r.get("stall_ms_per_token") for r in rs),
                peak_gpu_memory_gb=max(
                    (r["peak_gpu_memory_gb"] for r in rs if r.get("peak_gpu_memory_gb")),
                    default=None,
                ),
                belady_tpot_ms=mean_or_none(r.get("belady_tpot_ms") for r in rs),
                tpot_over_belady=mean_or_none(r.get("tpot_over_belady") for r in rs),
                checked=sum(r.get("matches_reference") is not None for r in rs),
                mismatches=sum(r.get("matches_reference") is False for r in rs),
                engine_checked=sum(r.get("matches_engine_reference") is not None for r in rs),
                engine_mismatches=sum(r.get("matches_engine_reference") is False for r in rs),
                notes=tuple(sorted({r["note"] for r in rs if r.get("note")})),
                run=run,
                source=", ".join(sorted({source_label(r) for r in rs} - {""})),
            )
        )
    return out


def tpot_table(records: Iterable[dict[str, Any]]) -> str:
    """TPOT per model x budget x system, with acceptance, hit rate and the Belady ratio (and
    the run, when the records come from more than one)."""
    rows = []
    summaries = summarize_tpot(records)
    for s in summaries:
        checked = f"{s.checked - s.mismatches}/{s.checked}" if s.checked else "-"
        engine = (
            f"{s.engine_checked - s.engine_mismatches}/{s.engine_checked}"
            if s.engine_checked
            else "-"
        )
        rows.append(
            [
                s.model,
                budget_label(s.budget_gb),
                s.system,
                s.prompts,
                s.tpot_ms,
                s.tokens_per_s,
                s.acceptance_rate,
                s.accepted_per_iteration,
                s.depth,
                s.hit_rate,
                s.h2d_mb_per_token,
                s.stall_ms_per_token,
                s.peak_gpu_memory_gb,
                s.tpot_over_belady,
                checked,
                engine,
            ]
        )
    headers = [
        "model",
        "budget",
        "system",
        "prompts",
        "TPOT ms",
        "tok/s",
        "acceptance",
        "accepted/iter",
        "depth",
        "hit rate",
        "H2D MB/tok",
        "stall ms/tok",
        "peak GB",
        "TPOT/Belady",
        "= ref",
        "= engine",
    ]
    return markdown_table(*_with_runs(headers, rows, summaries))


def _with_runs(
    headers: list[str], rows: list[list[Any]], summaries: Sequence[SystemSummary]
) -> tuple[list[str], list[list[Any]]]:
    """Append a ``source`` column (each row's result file) when the summaries carry one,
    else a ``run`` column when they come from more than one run."""
    if any(s.source for s in summaries):
        return [*headers, "source"], [
            [*row, s.source] for row, s in zip(rows, summaries, strict=True)
        ]
    if len({s.run for s in summaries}) < 2:
        return headers, rows
    return [*headers, "run"], [[*row, s.run or "-"] for row, s in zip(rows, summaries, strict=True)]


def phase_table(records: Iterable[dict[str, Any]]) -> str:
    """Latency per phase: prefill, draft and verify time per token, TPOT."""
    summaries = summarize_tpot(records)
    rows = [
        [
            s.model,
            budget_label(s.budget_gb),
            s.system,
            s.prefill_ms,
            s.draft_ms_per_token,
            s.verify_ms_per_token,
            s.tpot_ms,
            s.prefetch_precision,
            s.prefetch_recall,
        ]
        for s in summaries
    ]
    headers = [
        "model",
        "budget",
        "system",
        "prefill ms",
        "draft ms/tok",
        "verify ms/tok",
        "TPOT ms",
        "prefetch precision",
        "prefetch recall",
    ]
    return markdown_table(*_with_runs(headers, rows, summaries))
