"""Tables of what a user feels beside TPOT: time to first token per prompt length, load time
from the process's start, and memory against the budget (the allocator's and the driver's
view of the GPU, and the host's)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from specter_bench.bench_record import budget_label
from specter_bench.repeated_runs import median_range
from specter_bench.table_format import (
    budget_key,
    markdown_table,
    median_or_none,
    run_label,
    system_order,
    with_record_runs,
)

__all__ = ["load_table", "memory_use_table", "ttft_table"]


def _range_text(values: list[float]) -> str:
    spread = median_range(values)
    if spread is None or len(values) < 2:
        return "-"
    return f"{spread[1]:.1f}-{spread[2]:.1f}"


def ttft_table(records: Iterable[dict[str, Any]]) -> str:
    """Time to first token per model, budget, system and prompt length: the median over
    repeated runs and their range, the prefill's share, TPOT at that length, the driver's
    peak, and whether the greedy tokens equal the first system's at that length."""
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        if r.get("kind") == "ttft":
            d = r["data"]
            key = (r["model"], r["budget_gb"], d["system"], d["prompt_tokens"], run_label(r))
            groups[key].append(r)
    rows, row_records = [], []
    for key in sorted(
        groups, key=lambda k: (k[0], budget_key(k[1]), system_order(k[2]), k[3], k[4])
    ):
        model, budget, system, length, _ = key
        rs = groups[key]
        data = [r["data"] for r in rs]
        ttft = [d["ttft_ms"] for d in data if d.get("ttft_ms") is not None]
        checked = [d["matches_reference"] for d in data if d.get("matches_reference") is not None]
        speculation = {d.get("speculation") for d in data} - {None}
        drivers = [
            d["driver_peak_gpu_memory_gb"]
            for d in data
            if d.get("driver_peak_gpu_memory_gb") is not None
        ]
        rows.append(
            [
                model,
                budget_label(budget),
                system,
                length,
                median_or_none(ttft),
                _range_text(ttft),
                len(rs),
                median_or_none(d.get("prefill_ms") for d in data),
                median_or_none(d.get("tpot_ms") for d in data),
                max(drivers, default=None),
                f"{sum(checked)}/{len(checked)}" if checked else "-",
                "; ".join(sorted(speculation)) or "-",
            ]
        )
        row_records.append(rs[0])
    headers = [
        "model", "budget", "system", "prompt tokens", "TTFT ms", "TTFT range", "runs",
        "prefill ms", "TPOT ms", "driver peak GB", "= ref", "speculation",
    ]  # fmt: skip
    return markdown_table(*with_record_runs(headers, rows, row_records))


def _memory_records(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(
        (r for r in records if r.get("kind") == "memory"),
        key=lambda r: (r["model"], budget_key(r["budget_gb"])),
    )


def _systems(data: dict[str, Any]) -> str:
    systems = data.get("systems")
    if systems:
        return ", ".join(systems)
    return "draft load" if data.get("with_draft", True) else "draftless load"


def load_table(records: Iterable[dict[str, Any]]) -> str:
    """Load time per engine load: the load itself, and from the process's start to the
    model loaded and to its first token (a process's first load is what a user waits for:
    later loads of a run follow earlier stages), with the weights it read."""
    recs = [r for r in _memory_records(records) if r["data"].get("process_to_loaded_s")]
    rows = [
        [
            r["model"],
            budget_label(r["budget_gb"]),
            _systems(r["data"]),
            (r.get("identity") or {}).get("weights"),
            r["data"].get("load_s"),
            r["data"].get("process_to_loaded_s"),
            r["data"].get("process_to_first_token_s"),
            r["data"].get("first_load_in_process"),
        ]
        for r in recs
    ]
    headers = [
        "model", "budget", "systems", "weights", "load s", "process start to loaded s",
        "process start to first token s", "first load of the process",
    ]  # fmt: skip
    return markdown_table(*with_record_runs(headers, rows, recs))


def memory_use_table(records: Iterable[dict[str, Any]]) -> str:
    """Memory against the budget per engine load: the allocator's peak (what the budget
    bounds), the driver's peak (the CUDA context and every reserved block too) and what the
    device held before the load, and the host's peak resident set and pinned expert store.
    GPU columns are ``-`` on a CPU (no driver to ask)."""
    recs = _memory_records(records)
    rows = []
    for r in recs:
        d = r["data"]
        budget = r["budget_gb"]
        driver = d.get("driver_peak_gb")
        rows.append(
            [
                r["model"],
                budget_label(budget),
                _systems(d),
                d.get("measured_peak_gb"),
                driver,
                driver - budget if driver is not None and budget is not None else None,
                d.get("driver_before_load_gb"),
                d.get("device_total_gb"),
                d.get("host_peak_rss_gb"),
                d.get("host_pinned_gb"),
            ]
        )
    headers = [
        "model", "budget", "systems", "allocator peak GB", "driver peak GB",
        "driver peak - budget GB", "driver before load GB", "device GB", "host peak RSS GB",
        "host pinned GB",
    ]  # fmt: skip
    return markdown_table(*with_record_runs(headers, rows, recs))
