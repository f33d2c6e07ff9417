"""Markdown tables of benchmark records: TPOT per system, targets, phases, routing, policies.

Every table is built from the records alone (``read_records``), so the report can be
regenerated from committed JSON lines. TPOT is the median over prompts, other columns are
means; records of different runs (processes) stay in separate rows, and a target's ratio
compares two systems of one run when some run measured both. A cell with no value is ``-``.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from specter_bench.bench_record import SYSTEM_NAMES, budget_label

__all__ = [
    "TARGETS",
    "SystemSummary",
    "Target",
    "agreement_table",
    "depth_sweep_table",
    "evaluate_targets",
    "format_value",
    "hot_experts_table",
    "hot_sweep_table",
    "kernel_table",
    "markdown_table",
    "memory_table",
    "phase_table",
    "policy_table",
    "run_label",
    "summarize_tpot",
    "system_order",
    "targets_table",
    "tpot_table",
    "working_set_table",
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


def _budget_key(budget: float | None) -> tuple[int, float]:
    return (1, 0.0) if budget is None else (0, float(budget))


def system_order(system: str) -> tuple[int, str]:
    """Sort key: the order of ``SYSTEM_NAMES``, unknown names last (alphabetically)."""
    return (SYSTEM_NAMES.index(system), system) if system in SYSTEM_NAMES else (99, system)


def _mean(values: Iterable[Any]) -> float | None:
    kept = [float(v) for v in values if v is not None]
    return statistics.fmean(kept) if kept else None


def _median(values: Iterable[Any]) -> float | None:
    kept = [float(v) for v in values if v is not None]
    return statistics.median(kept) if kept else None


def run_label(record: dict[str, Any]) -> str:
    """The run (one ``specter bench`` process) a record comes from: its start time and
    commit, ``"2026-11-29T14:24 a05b05e"`` (labels sort by time); empty when the record has
    no identity."""
    identity = record.get("identity") or {}
    started = (identity.get("started_at") or "")[:16]
    commit = identity.get("git_commit") or ""
    return f"{started} {commit}".strip()


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


def summarize_tpot(records: Iterable[dict[str, Any]]) -> list[SystemSummary]:
    """Group ``tpot`` records by (model, budget, system, run) and summarise over prompts:
    the median TPOT, means of the rest.

    Rows come sorted by model, budget (unlimited last), the order of
    :data:`~specter_bench.bench_record.SYSTEM_NAMES` and run.
    """
    groups: dict[tuple[str, float | None, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        if r.get("kind") == "tpot":
            groups[(r["model"], r["budget_gb"], r["system"], run_label(r))].append(r)
    out = []
    for (model, budget, system, run), rs in sorted(
        groups.items(),
        key=lambda kv: (kv[0][0], _budget_key(kv[0][1]), system_order(kv[0][2]), kv[0][3]),
    ):
        h2d = _mean(r.get("h2d_bytes_per_token") for r in rs)
        out.append(
            SystemSummary(
                model=model,
                budget_gb=budget,
                system=system,
                prompts=len(rs),
                new_tokens=sum(int(r.get("new_tokens") or 0) for r in rs),
                tpot_ms=_median(r.get("tpot_ms") for r in rs),
                tokens_per_s=_mean(r.get("tokens_per_s") for r in rs),
                prefill_ms=_mean(r.get("prefill_ms") for r in rs),
                draft_ms_per_token=_mean(r.get("draft_ms_per_token") for r in rs),
                verify_ms_per_token=_mean(r.get("verify_ms_per_token") for r in rs),
                acceptance_rate=_mean(r.get("acceptance_rate") for r in rs),
                accepted_per_iteration=_mean(r.get("accepted_per_iteration") for r in rs),
                depth=_mean(r.get("depth") for r in rs),
                hit_rate=_mean(r.get("hit_rate") for r in rs),
                prefetch_precision=_mean(r.get("prefetch_precision") for r in rs),
                prefetch_recall=_mean(r.get("prefetch_recall") for r in rs),
                h2d_mb_per_token=None if h2d is None else h2d / 1e6,
                stall_ms_per_token=_mean(r.get("stall_ms_per_token") for r in rs),
                peak_gpu_memory_gb=max(
                    (r["peak_gpu_memory_gb"] for r in rs if r.get("peak_gpu_memory_gb")),
                    default=None,
                ),
                belady_tpot_ms=_mean(r.get("belady_tpot_ms") for r in rs),
                tpot_over_belady=_mean(r.get("tpot_over_belady") for r in rs),
                checked=sum(r.get("matches_reference") is not None for r in rs),
                mismatches=sum(r.get("matches_reference") is False for r in rs),
                engine_checked=sum(r.get("matches_engine_reference") is not None for r in rs),
                engine_mismatches=sum(r.get("matches_engine_reference") is False for r in rs),
                notes=tuple(sorted({r["note"] for r in rs if r.get("note")})),
                run=run,
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
    """Append a ``run`` column when the summaries come from more than one run."""
    if len({s.run for s in summaries}) < 2:
        return headers, rows
    return [*headers, "run"], [[*row, s.run or "-"] for row, s in zip(rows, summaries, strict=True)]


def _with_record_runs(
    headers: list[str], rows: list[list[Any]], row_records: Sequence[dict[str, Any]]
) -> tuple[list[str], list[list[Any]]]:
    """Append a ``run`` column (each row's record's :func:`run_label`) when the rows come
    from more than one run, as :func:`tpot_table` does: an experiment repeated over runs
    then reads as repetitions, not as one result printed several times."""
    labels = [run_label(r) for r in row_records]
    if len(set(labels)) < 2:
        return headers, rows
    labelled = [[*row, label or "-"] for row, label in zip(rows, labels, strict=True)]
    return [*headers, "run"], labelled


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


@dataclass(frozen=True)
class Target:
    """One of the issue's targets: ``system``'s TPOT over ``versus``'s at most ``limit``.

    ``versus == "belady"`` compares with the system's own Belady bound; ``budget_gb`` None
    means the unlimited budget; ``model`` None applies to every model.
    """

    system: str
    versus: str
    limit: float
    limit_text: str
    budget_gb: float | None
    model: str | None = None


TARGETS = (
    Target("specter", "lru", 1 / 2, "<= 1/2", 24.0, "deepseek-v2-lite"),
    Target("specter", "spec-lru", 2 / 3, "<= 2/3", 24.0, "deepseek-v2-lite"),
    Target("specter", "belady", 1.5, "<= 1.5", 24.0, "deepseek-v2-lite"),
    Target("specter", "hf", 1 / 3, "<= 1/3", None, "deepseek-v2-lite"),
)
"""Issue 7's targets (DeepSeek-V2-Lite, random weights, greedy, HumanEval)."""

RECENT_RUNS = 5
"""How many of the latest runs that measured both sides of a ratio the Targets table
quotes beside the latest one (a ratio that turns on a baseline's host time moves from run
to run; one run cannot say whether a cell is met)."""


def _same_ratios_elsewhere(
    summaries: Sequence[SystemSummary], targets: Sequence[Target]
) -> list[Target]:
    """The targets' ratios for models without targets, at their largest finite budget."""
    targeted = {t.model for t in targets}
    out = []
    for model in sorted({s.model for s in summaries} - targeted):
        finite = [s.budget_gb for s in summaries if s.model == model and s.budget_gb is not None]
        high = max(finite) if finite else None
        for t in targets:
            budget = None if t.budget_gb is None else high
            if t.budget_gb is not None and high is None:
                continue
            out.append(Target(t.system, t.versus, float("nan"), "(no target)", budget, model))
    return out


def evaluate_targets(
    records: Iterable[dict[str, Any]], targets: Sequence[Target] = TARGETS
) -> list[dict[str, Any]]:
    """Each target's measured ratio, whether it is met, and the acceptance beside it.

    Models the targets do not name get the same ratios at their largest finite budget and
    unlimited, marked ``(no target)`` (``met`` None).

    Each target is quoted from the experiment that measures it. A ratio's two sides come
    from one run when any measured both: the latest TPOT-only run (a ``--experiment tpot``
    process) that did, else the latest run that did; else from the latest run of each, and
    ``same_run`` says so. A Belady target takes the latest run that measured the bound
    (only a routing run does). Taking the latest run of any kind would let a run made for
    another experiment decide a TPOT cell: on the H200 the two DeepSeek-V2-Lite 24 GB
    routing runs after the 32-column per-pair tile measured ``lru`` at 27-29 ms per token,
    against 17-24 ms in the TPOT-only processes of the same code (docs/benchmarks.md).

    Returns:
        One dict per target: ``model``, ``budget``, ``target`` (text), ``ratio`` (None when
        a side was not measured), ``met`` (None then, or without a target), ``tpot_ms``,
        ``versus_tpot_ms``, ``acceptance_rate``, ``run`` (the run of ``tpot_ms``),
        ``same_run`` (False when the two sides come from different runs) and ``recent``:
        the ratios of the last :data:`RECENT_RUNS` runs that measured both sides (TPOT-only
        runs when any did), oldest first, ending with ``ratio`` (empty for a Belady target,
        which one routing run measures, or without such a run).
    """
    records = list(records)
    tpot_only = {
        run_label(r)
        for r in records
        if r.get("kind") == "tpot" and (r.get("identity") or {}).get("experiment") == "tpot"
    }
    summaries = summarize_tpot(records)
    index: dict[tuple[str, float | None, str], dict[str, SystemSummary]] = defaultdict(dict)
    for s in summaries:
        index[(s.model, s.budget_gb, s.system)][s.run] = s
    models = sorted({s.model for s in summaries})
    out = []
    for t in [*targets, *_same_ratios_elsewhere(summaries, targets)]:
        for model in [t.model] if t.model is not None else models:
            mine_runs = index.get((model, t.budget_gb, t.system), {})
            same_run = True
            if t.versus == "belady":
                # The latest run that measured a bound (a TPOT-only run records none).
                bounded = [run for run, m in mine_runs.items() if m.belady_tpot_ms is not None]
                latest = max(bounded or mine_runs, default=None)
                mine = mine_runs[latest] if latest is not None else None
                other = mine.belady_tpot_ms if mine is not None else None
                ratio = mine.tpot_over_belady if mine is not None else None
                recent = []
            else:
                # The hf baseline has no budget: it is measured once, at "unlimited". Any
                # other system is compared at the target's own budget only.
                ref_runs = index.get((model, t.budget_gb, t.versus), {})
                if not ref_runs and t.versus == "hf":
                    ref_runs = index.get((model, None, t.versus), {})
                mine, ref, same_run = _pair(mine_runs, ref_runs, tpot_only)
                recent = _recent_ratios(mine_runs, ref_runs, tpot_only) if same_run else []
                other = ref.tpot_ms if ref is not None else None
                ratio = (
                    mine.tpot_ms / other
                    if mine is not None and mine.tpot_ms is not None and other
                    else None
                )
            out.append(
                {
                    "model": model,
                    "budget": budget_label(t.budget_gb),
                    "target": f"{t.system} / {t.versus} {t.limit_text}",
                    "ratio": ratio,
                    "met": None if ratio is None or t.limit != t.limit else ratio <= t.limit,
                    "tpot_ms": mine.tpot_ms if mine is not None else None,
                    "versus_tpot_ms": other,
                    "acceptance_rate": mine.acceptance_rate if mine is not None else None,
                    "run": mine.run if mine is not None else None,
                    "same_run": same_run,
                    "recent": recent,
                }
            )
    return out


def _pair(
    mine: dict[str, SystemSummary],
    ref: dict[str, SystemSummary],
    preferred: AbstractSet[str] = frozenset(),
) -> tuple[SystemSummary | None, SystemSummary | None, bool]:
    """The two sides of a ratio: from the latest ``preferred`` run that measured both, else
    the latest run that did, else the latest of each (``same_run`` False when both exist but
    no run holds both)."""
    shared = _shared_runs(mine, ref, preferred)
    if shared:
        return mine[shared[-1]], ref[shared[-1]], True
    first = mine[max(mine)] if mine else None
    second = ref[max(ref)] if ref else None
    return first, second, first is None or second is None


def _shared_runs(
    mine: dict[str, SystemSummary],
    ref: dict[str, SystemSummary],
    preferred: AbstractSet[str] = frozenset(),
) -> list[str]:
    """The runs that measured both sides, oldest first: the ``preferred`` ones when any did."""
    shared = sorted(set(mine) & set(ref))
    return [run for run in shared if run in preferred] or shared


def _recent_ratios(
    mine: dict[str, SystemSummary],
    ref: dict[str, SystemSummary],
    preferred: AbstractSet[str] = frozenset(),
) -> list[float]:
    """The ratios of the last ``RECENT_RUNS`` runs that measured both sides (``preferred``
    runs when any did, as :func:`_pair` picks), oldest first."""
    shared = _shared_runs(mine, ref, preferred)
    return [
        mine[run].tpot_ms / ref[run].tpot_ms
        for run in shared[-RECENT_RUNS:]
        if mine[run].tpot_ms is not None and ref[run].tpot_ms
    ]


def targets_table(records: Iterable[dict[str, Any]], targets: Sequence[Target] = TARGETS) -> str:
    """Every target cell, met or not, with the measured acceptance beside it, and the
    ratios of the last runs that measured it (the status counts them when they disagree)."""
    evaluated = evaluate_targets(records, targets)
    limits = {f"{t.system} / {t.versus} {t.limit_text}": t.limit for t in targets}
    rows = [
        [
            t["model"],
            t["budget"],
            t["target"],
            t["tpot_ms"],
            t["versus_tpot_ms"],
            t["ratio"],
            _status(t, limits.get(t["target"])),
            t["acceptance_rate"],
            ", ".join(f"{r:.2f}" for r in t["recent"]) if len(t["recent"]) > 1 else "-",
        ]
        for t in evaluated
    ]
    headers = [
        "model", "budget", "target", "TPOT ms", "versus ms", "ratio", "status", "acceptance",
        f"last runs (up to {RECENT_RUNS})",
    ]  # fmt: skip
    return markdown_table(headers, rows)


def _status(target: dict[str, Any], limit: float | None = None) -> str:
    if target["ratio"] is None:
        return "not measured"
    runs = "" if target.get("same_run", True) else " (two runs)"
    if target["met"] is None:
        return "-" + runs
    recent = target.get("recent") or []
    if limit is not None and len(recent) > 1:
        met = sum(1 for r in recent if r <= limit)
        if 0 < met < len(recent):  # the runs disagree: say how often it was met
            return f"met in {met} of the last {len(recent)} runs"
    return ("met" if target["met"] else "NOT met") + runs


def _experiments(records: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [r for r in records if r.get("kind") == kind]


def _by_model_and_budget(records: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The ``kind`` records sorted by model, then budget (unlimited last)."""
    return sorted(
        _experiments(records, kind), key=lambda r: (r["model"], _budget_key(r["budget_gb"]))
    )


def working_set_table(records: Iterable[dict[str, Any]]) -> str:
    """Distinct experts per layer against depth K, per model (mean [p10, p90])."""
    rows, row_records = [], []
    for r in _experiments(records, "working_set"):
        for point in r["data"]["curve"]:
            row_records.append(r)
            rows.append(
                [
                    r["model"],
                    r["data"].get("routing", "target"),
                    point["depth"],
                    point["mean"],
                    point["p10"],
                    point["p90"],
                    point["minimum"],
                    point["maximum"],
                    r["data"].get("prompts"),
                ]
            )
    headers = ["model", "routing", "K", "mean", "p10", "p90", "min", "max", "prompts"]
    return markdown_table(*_with_record_runs(headers, rows, row_records))


def agreement_table(records: Iterable[dict[str, Any]]) -> str:
    """Draft/target agreement per model: routing match (mean, worst/best layer, per request),
    greedy agreement and the sampled acceptance of speculative sampling at T = 1 and 0.7."""
    rows = []
    recs = _experiments(records, "routing_agreement")
    for r in recs:
        d = r["data"]
        per_layer = d["per_layer"]
        per_request = d.get("per_request", [])
        rows.append(
            [
                r["model"],
                d["mean"],
                d.get("exact_rate"),
                min(per_layer) if per_layer else None,
                max(per_layer) if per_layer else None,
                min(per_request) if per_request else None,
                max(per_request) if per_request else None,
                len(per_request),
                d.get("greedy_agreement"),
                d.get("sampled_acceptance"),
                d.get("sampled_acceptance_t0.7"),
            ]
        )
    headers = [
        "model",
        "match rate",
        "exact sets",
        "worst layer",
        "best layer",
        "worst request",
        "best request",
        "requests",
        "greedy agreement",
        "sampled acceptance T=1",
        "sampled acceptance T=0.7",
    ]
    return markdown_table(*_with_record_runs(headers, rows, recs))


def policy_table(records: Iterable[dict[str, Any]]) -> str:
    """Cache hit rate and expert loads per policy (LRU, LFU, predictive, Belady).

    With a pinned hot set: ``pinned`` (the hot set pinned, LRU over its plan's other slots)
    and Belady at that plan's slots, warm-started as the bound is (records since the
    thirty-first session).

    A step is ``window`` tokens (1: plain decoding; K + 1: one verification). Hit rates count
    what the cache found resident when a step asked for it, so the predictive policy's
    prefetches (the draft's routing of the step, loaded before it) count as hits; Belady's is
    the optimal on-demand schedule. Loads (transfers) compare every policy: none can load
    fewer experts than Belady.
    """
    recs = sorted(
        _experiments(records, "policy_hit_rate"),
        key=lambda r: (r["model"], _budget_key(r["budget_gb"]), r["data"].get("window", 1)),
    )
    pinned = any("pinned" in r["data"]["policies"] for r in recs)
    at_pins = any("belady_pinned_slots" in r["data"]["policies"] for r in recs)
    policies = (
        "lru", "lfu", "predictive", "belady", *(("pinned",) if pinned else ()),
        *(("belady_pinned_slots",) if at_pins else ()),
    )  # fmt: skip
    names = {"belady_pinned_slots": "belady at the pinned slots (warm)"}
    rows = []
    for r in recs:
        d = r["data"]
        row = [
            r["model"],
            budget_label(r["budget_gb"]),
            d.get("window", 1),
            d.get("slots_per_layer"),
            *[d["policies"].get(p, {}).get("hit_rate") for p in policies],
            " / ".join(str(d["policies"].get(p, {}).get("loads", "-")) for p in policies),
        ]
        if pinned:
            conf = d.get("pinned")
            row.append(f"{conf['experts_per_layer']} / {conf['slots_per_layer']}" if conf else "-")
        rows.append(row)
    headers = [
        "model",
        "budget",
        "window",
        "slots",
        *[f"{names.get(p, p)} hit rate" for p in policies],
        "loads (" + " / ".join(names.get(p, p) for p in policies) + ")",
        *(["pinned experts / slots"] if pinned else []),
    ]
    return markdown_table(*_with_record_runs(headers, rows, recs))


def depth_sweep_table(records: Iterable[dict[str, Any]]) -> str:
    """TPOT and acceptance against depth K, per model and budget (best depth marked)."""
    rows, row_records = [], []
    recs = _by_model_and_budget(records, "depth_sweep")
    for r in recs:
        d = r["data"]
        best = d.get("best_depth")
        for point in d["points"]:
            row_records.append(r)
            rows.append(
                [
                    r["model"],
                    budget_label(r["budget_gb"]),
                    point["depth"],
                    point["tpot_ms"],
                    point.get("acceptance_rate"),
                    point.get("accepted_per_iteration"),
                    "best" if point["depth"] == best else "",
                ]
            )
    headers = ["model", "budget", "K", "TPOT ms", "acceptance", "accepted/iter", ""]
    return markdown_table(*_with_record_runs(headers, rows, row_records))


def memory_table(records: Iterable[dict[str, Any]]) -> str:
    """Memory accounting per model and budget: planned parts, slots, expected and measured peak."""
    columns: list[tuple[str, Callable[[dict[str, Any]], Any]]] = [
        ("non-expert GB", lambda d: d.get("non_expert_gb")),
        ("INT4 draft GB", lambda d: d.get("draft_gb")),
        ("KV GB", lambda d: d.get("kv_gb")),
        ("buffers GB", lambda d: d.get("buffers_gb")),
        ("slots GB", lambda d: d.get("slots_gb")),
        ("slots/layer", lambda d: d.get("slots_per_layer")),
        ("expected peak GB", lambda d: d.get("expected_peak_gb")),
        ("measured peak GB", lambda d: d.get("measured_peak_gb")),
    ]
    recs = _by_model_and_budget(records, "memory")
    rows = [
        [
            r["model"],
            budget_label(r["budget_gb"]),
            _draft_label(r["data"]),
            *[get(r["data"]) for _, get in columns],
        ]
        for r in recs
    ]
    headers = ["model", "budget", "draft", *[name for name, _ in columns]]
    return markdown_table(*_with_record_runs(headers, rows, recs))


def _draft_label(data: dict[str, Any]) -> str:
    """``int4``, ``int4 + h hot`` (a pinned hot set), ``..., p pruned`` (experts the draft
    skips) or ``none`` (a target-only load)."""
    if not data.get("with_draft", True):
        return "none"
    hot = data.get("hot_experts_per_layer") or 0
    pruned = data.get("pruned_experts_per_layer") or 0
    label = f"int4 + {hot} hot" if hot else "int4"
    return f"{label}, {pruned} pruned" if pruned else label


def hot_experts_table(records: Iterable[dict[str, Any]]) -> str:
    """The pinned hot set chosen per model and budget, with the replayed loads behind it."""
    recs = _by_model_and_budget(records, "hot_experts")
    rows = []
    for r in recs:
        d = r["data"]
        counts = sorted(d["loads"].items(), key=lambda item: int(item[0]))
        loads = ", ".join(f"{h}: {n}" for h, n in counts)
        rows.append(
            [
                r["model"],
                budget_label(r["budget_gb"]),
                d["per_layer"],
                d.get("pruned_per_layer", 0),
                d["slots_per_layer"],
                d.get("window"),
                ", ".join(d.get("calibration_prompts", [])),
                loads,
            ]
        )
    headers = ["model", "budget", "pinned/layer", "pruned/layer", "slots/layer", "window",
               "calibration", "replayed loads (pinned: loads)"]  # fmt: skip
    return markdown_table(*_with_record_runs(headers, rows, recs))


def hot_sweep_table(records: Iterable[dict[str, Any]]) -> str:
    """specter's TPOT against the pinned hot count, per model and budget (the chosen count
    marked)."""
    rows, row_records = [], []
    recs = _by_model_and_budget(records, "hot_sweep")
    for r in recs:
        d = r["data"]
        for point in d["points"]:
            matches = [m for m in point.get("matches_engine", []) if m is not None]
            row_records.append(r)
            rows.append(
                [
                    r["model"],
                    budget_label(r["budget_gb"]),
                    point["hot_experts_per_layer"],
                    point["slots_per_layer"],
                    point["tpot_ms"],
                    point.get("acceptance_rate"),
                    point.get("hit_rate"),
                    point.get("h2d_mb_per_token"),
                    point.get("replayed_loads"),
                    f"{sum(matches)}/{len(matches)}" if matches else "-",
                    "chosen" if point["hot_experts_per_layer"] == d.get("chosen") else "",
                ]
            )
    headers = ["model", "budget", "pinned/layer", "slots/layer", "TPOT ms", "acceptance",
               "hit rate", "H2D MB/tok", "replayed loads", "= engine", ""]  # fmt: skip
    return markdown_table(*_with_record_runs(headers, rows, row_records))


def kernel_table(records: Iterable[dict[str, Any]]) -> str:
    """``kernel-bench`` timings: one row per (model, T, path), with the error checked first."""
    rows = [
        [t["model"], t["tokens"], t["path"], t["median_ms"], f"{t['relative_error']:.1e}"]
        for r in _experiments(records, "kernel")
        for t in r["data"]["timings"]
    ]
    return markdown_table(["model", "T", "path", "median ms", "rel. error"], rows)
