"""TPOT tables: the per-(model, budget, system, run) summary, TPOT per system, latency per
phase.

TPOT is the median over prompts, other columns are means; records of different runs
(processes) stay in separate rows. Within one process, repeated runs of a cell
(``--runs``, see :mod:`~specter_bench.repeated_runs`) give each run's TPOT; the cell's TPOT
is their median, shown with their range.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from specter_bench.bench_record import budget_label
from specter_bench.repeated_runs import median_range, per_run
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

__all__ = [
    "SYSTEM_LABELS",
    "SystemSummary",
    "phase_table",
    "summarize_tpot",
    "system_label",
    "tpot_table",
]


@dataclass(frozen=True)
class SystemSummary:
    """One (model, budget, system) of one run over its prompts: the median TPOT (over its
    repeated runs' medians when it has several), the other figures' means.

    ``tpot_by_run``: ``{run_index: median TPOT over that run's prompts}``; ``tpot_min_ms``
    and ``tpot_max_ms`` their range; ``ttft_ms``: the median time to first token;
    ``driver_peak_gpu_memory_gb``: the most the driver reported; ``speculation``: what
    the records say of it where they say it (``off (depth auto chose 0: ...)``).
    """

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
    tpot_by_run: dict[int, float] = field(default_factory=dict, hash=False)
    tpot_min_ms: float | None = None
    tpot_max_ms: float | None = None
    ttft_ms: float | None = None
    driver_peak_gpu_memory_gb: float | None = None
    speculation: str | None = None

    @property
    def runs(self) -> int:
        """Repeated runs of this cell (1 for records without a run index)."""
        return max(1, len(self.tpot_by_run))

    @property
    def tpot_range(self) -> str:
        """``"min-max (N runs)"`` of the runs' TPOTs, ``"-"`` with one run."""
        if self.runs < 2 or self.tpot_min_ms is None or self.tpot_max_ms is None:
            return "-"
        return f"{self.tpot_min_ms:.2f}-{self.tpot_max_ms:.2f} ({self.runs} runs)"


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
        by_run = per_run(rs)
        spread = median_range(by_run.values())
        drivers = [r["driver_peak_gpu_memory_gb"] for r in rs if r.get("driver_peak_gpu_memory_gb")]
        said = sorted({str(_speculation(r)) for r in rs if _speculation(r)})
        out.append(
            SystemSummary(
                model=model,
                budget_gb=budget,
                system=system,
                prompts=len(rs),
                new_tokens=sum(int(r.get("new_tokens") or 0) for r in rs),
                tpot_ms=spread[0] if spread else median_or_none(r.get("tpot_ms") for r in rs),
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
                tpot_by_run=by_run,
                tpot_min_ms=spread[1] if spread else None,
                tpot_max_ms=spread[2] if spread else None,
                ttft_ms=median_or_none(r.get("ttft_ms") for r in rs),
                driver_peak_gpu_memory_gb=max(drivers, default=None),
                speculation="; ".join(said) or None,
            )
        )
    return out


def _speculation(record: dict[str, Any]) -> str | None:
    """What a record's settings say of speculation where it is switched off by a choice
    (``off (depth auto chose 0: ...)``), else None."""
    said = ((record.get("extra") or {}).get("settings") or {}).get("speculation")
    return said if isinstance(said, str) and said.startswith("off (") else None


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
                system_label(s.system),
                s.prompts,
                s.tpot_ms,
                s.tpot_range,
                s.ttft_ms,
                s.tokens_per_s,
                s.acceptance_rate,
                s.accepted_per_iteration,
                s.depth,
                s.hit_rate,
                s.h2d_mb_per_token,
                s.stall_ms_per_token,
                s.peak_gpu_memory_gb,
                s.driver_peak_gpu_memory_gb,
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
        "TPOT range",
        "TTFT ms",
        "tok/s",
        "acceptance",
        "accepted/iter",
        "depth",
        "hit rate",
        "H2D MB/tok",
        "stall ms/tok",
        "peak GB",
        "driver peak GB",
        "TPOT/Belady",
        "= ref",
        "= engine",
    ]
    headers, rows = _with_runs(headers, rows, summaries)
    if any(s.speculation for s in summaries):
        headers = [*headers, "speculation"]
        rows = [[*row, s.speculation or "-"] for row, s in zip(rows, summaries, strict=True)]
    return markdown_table(headers, rows)


def system_label(system: str) -> str:
    """A system's name for a table, with what bounds it where a reader must know (``lru``:
    the textbook reference, host-bound)."""
    return SYSTEM_LABELS.get(system, system)


SYSTEM_LABELS = {"lru": "lru (textbook reference, host-bound)"}
"""Table labels of systems whose name alone would mislead."""


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
