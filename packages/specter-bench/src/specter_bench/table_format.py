"""Markdown table cells and rows shared by the report's tables.

Every table is built from the records alone (``read_records``), so a report can be
regenerated from committed JSON lines. A cell with no value is ``-``. Records read for the
results page carry a ``source`` (the result file they came from); tables then name it in a
``source`` column, one per row.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from specter_bench.bench_record import SYSTEM_NAMES

__all__ = [
    "budget_key",
    "format_value",
    "markdown_table",
    "mean_or_none",
    "median_or_none",
    "model_label",
    "run_label",
    "source_label",
    "system_order",
    "with_record_runs",
]


def format_value(value: Any, digits: int = 2) -> str:
    """A table cell: ``-`` for None, fixed decimals for floats, ``str`` otherwise."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], digits: int = 2) -> str:
    """A GitHub-flavoured markdown table; numbers right-aligned.

    Args:
        headers: column titles.
        rows: one sequence of cells per row (cells are formatted with :func:`format_value`).
        digits: decimals of float cells.

    Raises:
        ValueError: a row whose length differs from ``headers``.
    """
    rows = [list(r) for r in rows]
    for r in rows:
        if len(r) != len(headers):
            raise ValueError(f"row {r} has {len(r)} cells for {len(headers)} headers {headers}.")
    numeric = [
        bool(rows) and all(isinstance(r[i], int | float) or r[i] is None for r in rows)
        for i in range(len(headers))
    ]
    lines = ["| " + " | ".join(headers) + " |"]
    lines.append("|" + "|".join("---:" if n else "---" for n in numeric) + "|")
    for r in rows:
        cells = [format_value(c, digits).replace("|", "\\|") for c in r]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def budget_key(budget: float | None) -> tuple[int, float]:
    return (1, 0.0) if budget is None else (0, float(budget))


def system_order(system: str) -> tuple[int, str]:
    """Sort key: the order of ``SYSTEM_NAMES``, unknown names last (alphabetically)."""
    return (SYSTEM_NAMES.index(system), system) if system in SYSTEM_NAMES else (99, system)


def mean_or_none(values: Iterable[Any]) -> float | None:
    kept = [float(v) for v in values if v is not None]
    return statistics.fmean(kept) if kept else None


def median_or_none(values: Iterable[Any]) -> float | None:
    kept = [float(v) for v in values if v is not None]
    return statistics.median(kept) if kept else None


def model_label(record: dict[str, Any]) -> str:
    """The record's model, with the routing it decoded with when that was a replayed trace
    (``specter bench --routing replay``): ``"deepseek-v2-lite (replay:dsv2.pt)"``, so
    random and replayed routing never share a row."""
    routing = (record.get("identity") or {}).get("routing") or "random"
    model = str(record.get("model"))
    return model if routing == "random" else f"{model} ({routing})"


def base_model(label: str) -> str:
    """The model of a :func:`model_label`, without its routing: ``"deepseek-v2-lite"`` for
    ``"deepseek-v2-lite (replay:dsv2.pt)"``."""
    return label.split(" (replay:", 1)[0]


def run_label(record: dict[str, Any]) -> str:
    """The run (one ``specter bench`` process) a record comes from: its start time and
    commit, ``"2026-11-29T14:24 a05b05e"`` (labels sort by time); empty when the record has
    no identity."""
    identity = record.get("identity") or {}
    started = (identity.get("started_at") or "")[:16]
    commit = identity.get("git_commit") or ""
    return f"{started} {commit}".strip()


def source_label(record: dict[str, Any]) -> str:
    """The result file a record was read from (set by the results page's reader), or ``""``."""
    return str(record.get("source") or "")


def with_record_runs(
    headers: list[str], rows: list[list[Any]], row_records: Sequence[dict[str, Any]]
) -> tuple[list[str], list[list[Any]]]:
    """Append a ``run`` column (each row's record's :func:`run_label`) when the rows come
    from more than one run, as the TPOT table does (or a ``source`` column, each row's
    result file, when the records carry one): an experiment repeated over runs
    then reads as repetitions, not as one result printed several times."""
    if any(source_label(r) for r in row_records):
        sources = [source_label(r) or "-" for r in row_records]
        return [*headers, "source"], [[*row, s] for row, s in zip(rows, sources, strict=True)]
    labels = [run_label(r) for r in row_records]
    if len(set(labels)) < 2:
        return headers, rows
    labelled = [[*row, label or "-"] for row, label in zip(rows, labels, strict=True)]
    return [*headers, "run"], labelled
