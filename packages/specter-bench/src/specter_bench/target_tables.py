"""Target ratios: a system's TPOT over a baseline's (or over its Belady bound), met or not,
with the acceptance beside it and the ratios of the latest runs that measured both sides.

A ratio compares two systems of one run when some run measured both. Where that process
repeated its measured passes (``--runs``), the ratio is computed run by run and a target
is met only where it holds at the worst run (:func:`~specter_bench.repeated_runs.ratio_holds`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, replace
from typing import Any

from specter_bench.bench_record import budget_label
from specter_bench.repeated_runs import ratio_holds
from specter_bench.table_format import base_model, markdown_table, run_label
from specter_bench.tpot_tables import SystemSummary, summarize_tpot

__all__ = [
    "BATCH_TARGETS",
    "RECENT_RUNS",
    "TARGETS",
    "BatchTarget",
    "Target",
    "evaluate_targets",
    "targets_table",
]


@dataclass(frozen=True)
class Target:
    """One target ratio: ``system``'s TPOT over ``versus``'s at most ``limit``.

    ``versus == "belady"`` compares with the system's own Belady bound; ``budget_gb`` None
    means the unlimited budget; ``model`` None applies to every model. ``versus_unlimited``
    takes the ``versus`` side with every expert resident instead of at ``budget_gb`` (a
    system's offloading overhead over its own all-resident time).
    """

    system: str
    versus: str
    limit: float
    limit_text: str
    budget_gb: float | None
    model: str | None = None
    versus_unlimited: bool = False

    @property
    def name(self) -> str:
        """``"specter / offload <= 0.7"`` (``"specter / specter unlimited <= 2"``)."""
        versus = f"{self.versus} unlimited" if self.versus_unlimited else self.versus
        return f"{self.system} / {versus} {self.limit_text}"


DSV2 = "deepseek-v2-lite"
LLAMA_CPP_CPU_MOE = "llama.cpp-cpu-moe-f16"
LLAMA_CPP_GPU = "llama.cpp-gpu-f16"

TARGETS = (
    Target("specter", "offload", 0.7, "<= 0.7", 24.0, DSV2),
    Target("specter", LLAMA_CPP_CPU_MOE, 0.5, "<= 0.5", 24.0, DSV2),
    Target("specter", "offload", 0.8, "<= 0.8", 16.0, DSV2),
    Target("specter", LLAMA_CPP_GPU, 0.8, "<= 0.8", None, DSV2),
    Target("specter", "hf", 1 / 3, "<= 1/3", None, DSV2),
    Target("specter", "specter", 2.0, "<= 2", 24.0, DSV2, versus_unlimited=True),
)
"""The product's targets on DeepSeek-V2-Lite (greedy), against the strongest baselines: at
24 GB 0.7 of ``offload``'s time (the strongest plain offloader, Specter's own streamed misses
and hot set without a draft) and half of llama.cpp's with routed experts on the CPU at the
same GPU memory (``specter llama-cpp bench --n-cpu-moe auto``); at 16 GB 0.8 of
``offload``'s; with every expert resident 0.8 of llama.cpp's all-on-GPU F16 time and a
third of transformers' fastest configuration; and at 24 GB at most twice Specter's own
all-resident time (the offloading overhead). ``lru`` and ``spec-lru`` are textbook
references and the Belady bound a reported figure (``TPOT / Belady`` in the TPOT table),
not targets."""


@dataclass(frozen=True)
class BatchTarget:
    """One throughput target of the ``batch`` experiment: ``system``'s decode throughput at
    batch size ``batch_size`` over ``versus``'s at ``versus_batch_size``, at least ``limit``.

    ``batch_size`` None means every batch size measured (one cell each, ``versus`` at the
    same size); ``versus_batch_size`` None means the same size as ``batch_size``. A ratio of
    throughputs is met at its worst run, the smallest.
    """

    system: str
    versus: str
    limit: float
    limit_text: str
    budget_gb: float | None
    model: str | None = None
    batch_size: int | None = None
    versus_batch_size: int | None = None

    def name_at(self, batch_size: int | None) -> str:
        """``"specter / offload >= 1.3"`` or ``"specter B=8 / specter B=1 >= 4"``."""
        other = self.versus_batch_size
        if other is None or other == batch_size or batch_size is None:
            return f"{self.system} / {self.versus} {self.limit_text}"
        return f"{self.system} B={batch_size} / {self.versus} B={other} {self.limit_text}"


BATCH_TARGETS = (
    BatchTarget("specter", "specter", 4.0, ">= 4", 24.0, DSV2, batch_size=8, versus_batch_size=1),
    BatchTarget("specter", "offload", 1.3, ">= 1.3", 24.0, DSV2, batch_size=4),
    BatchTarget("specter", "offload", 1.0, ">= 1", 24.0, DSV2),
)
"""The batched experiment's targets on DeepSeek-V2-Lite at 24 GB (throughput, greedy): at
B = 8 at least 4 times ``specter``'s own throughput at B = 1; at least 1.3 times
``offload``'s (the same engine without a draft, batched) at B = 4, and at least ``offload``'s
at every B (where speculation does not pay at a batch size, the engine lowers K or turns it
off and its statistics say so). Other models show the same ratios at their high budget,
without a target."""

RECENT_RUNS = 5
"""How many of the latest runs that measured both sides of a ratio the Targets table
quotes beside the latest one (a ratio that turns on a baseline's host time moves from run
to run; one run cannot say whether a cell is met)."""


def untargeted_high_budgets(summaries: Sequence[Any], targets: Sequence[Any]) -> list:
    """``(model, largest finite budget or None)`` of each summarised model no target names
    (under any routing), in name order: where the targets' ratios are shown for
    information."""
    targeted = {t.model for t in targets}
    out = []
    for model in sorted(m for m in {s.model for s in summaries} if base_model(m) not in targeted):
        finite = [s.budget_gb for s in summaries if s.model == model and s.budget_gb is not None]
        out.append((model, max(finite) if finite else None))
    return out


def _same_ratios_elsewhere(
    summaries: Sequence[SystemSummary], targets: Sequence[Target]
) -> list[Target]:
    """The targets' ratios for models without targets, at their largest finite budget."""
    out = []
    for model, high in untargeted_high_budgets(summaries, targets):
        seen = set()
        for t in targets:
            budget = None if t.budget_gb is None else high
            key = (t.system, t.versus, budget, t.versus_unlimited)
            if (t.budget_gb is not None and high is None) or key in seen:
                continue
            seen.add(key)
            out.append(
                replace(
                    t, limit=float("nan"), limit_text="(no target)", budget_gb=budget, model=model
                )
            )
    return out


def evaluate_targets(
    records: Iterable[dict[str, Any]], targets: Sequence[Target] = TARGETS
) -> list[dict[str, Any]]:
    """Each target's measured ratio, whether it is met, and the acceptance beside it.

    A target holds under every routing its model was measured with: random weights' own and
    each replayed trace (``table_format.model_label``), one cell each. Models the targets do
    not name get the same ratios at their largest finite budget and unlimited, marked
    ``(no target)`` (``met`` None).

    Each target is quoted from the experiment that measures it. A ratio's two sides come
    from one run when any measured both: the latest TPOT-only run (a ``--experiment tpot``
    process) that did, else the latest run that did; else from the latest run of each, and
    ``same_run`` says so. A Belady target takes the latest run that measured the bound
    (only a routing run does). Taking the latest run of any kind would let a run made for
    another experiment decide a TPOT cell: on one H200, DeepSeek-V2-Lite 24 GB routing runs
    measured ``lru`` at 27-29 ms per token against 17-24 ms in TPOT-only processes of the
    same code.

    Returns:
        One dict per target: ``model``, ``budget``, ``target`` (text), ``ratio`` (None when
        a side was not measured), ``met`` (None then, or without a target), ``tpot_ms``,
        ``versus_tpot_ms``, ``acceptance_rate``, ``run`` (the run of ``tpot_ms``),
        ``same_run`` (False when the two sides come from different runs), ``per_run``
        (``{run_index: ratio}`` of that run's repeated passes, paired by index; then
        ``ratio`` is their median and ``met`` says whether the worst holds), ``source`` (the
        result files of both sides, ``""`` for records read without one) and ``recent``:
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
        for model in _routings_of(t.model, models) if t.model is not None else models:
            mine_runs = index.get((model, t.budget_gb, t.system), {})
            same_run = True
            paired: dict[int, float] = {}
            holds = None
            if t.versus == "belady":
                # The latest run that measured a bound (a TPOT-only run records none).
                bounded = [run for run, m in mine_runs.items() if m.belady_tpot_ms is not None]
                latest = max(bounded or mine_runs, default=None)
                mine = mine_runs[latest] if latest is not None else None
                other = mine.belady_tpot_ms if mine is not None else None
                ratio = mine.tpot_over_belady if mine is not None else None
                recent = []
                ref = None
            else:
                # The hf baseline has no budget: it is measured once, at "unlimited". Any
                # other system is compared at the target's own budget only.
                ref_budget = None if t.versus_unlimited else t.budget_gb
                ref_runs = index.get((model, ref_budget, t.versus), {})
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
                if same_run and mine is not None and ref is not None:
                    check = ratio_holds(t, mine.tpot_by_run, ref.tpot_by_run)
                    if len(check.ratios) > 1:  # repeated runs: the worst decides
                        paired, holds, ratio = check.ratios, check.holds, check.median
            limited = ratio is not None and t.limit == t.limit
            out.append(
                {
                    "model": model,
                    "budget": budget_label(t.budget_gb),
                    "target": t.name,
                    "ratio": ratio,
                    "met": (holds if paired else ratio <= t.limit) if limited else None,
                    "tpot_ms": mine.tpot_ms if mine is not None else None,
                    "versus_tpot_ms": other,
                    "acceptance_rate": mine.acceptance_rate if mine is not None else None,
                    "run": mine.run if mine is not None else None,
                    "same_run": same_run,
                    "per_run": paired,
                    "recent": recent,
                    "source": _sources(mine, ref),
                }
            )
    return out


def _routings_of(model: str, labels: Sequence[str]) -> list[str]:
    """The summarised labels of ``model`` (random routing first, then each replayed trace),
    or ``[model]`` when none was measured."""
    return [model, *sorted(m for m in labels if m != model and base_model(m) == model)]


def _sources(*sides: SystemSummary | None) -> str:
    """The result files of a ratio's sides, each once (``""`` when the records name none)."""
    names: list[str] = []
    for side in sides:
        for name in side.source.split(", ") if side is not None and side.source else []:
            if name not in names:
                names.append(name)
    return ", ".join(names)


def _pair(
    mine: dict[str, SystemSummary],
    ref: dict[str, SystemSummary],
    preferred: AbstractSet[str] = frozenset(),
) -> tuple[SystemSummary | None, SystemSummary | None, bool]:
    """The two sides of a ratio: from the ``preferred`` run that measured both, else any run
    that did, else the best of each (``same_run`` False when both exist but no run holds
    both). Among candidates the most repeated passes win, then the most prompts, then the
    latest: a three-pass run of ten prompts outweighs a later single pass."""
    shared = sorted(_shared_runs(mine, ref, preferred), key=lambda run: _weight(mine[run], run))
    if shared:
        return mine[shared[-1]], ref[shared[-1]], True
    first = max(mine.values(), key=lambda s: _weight(s, s.run)) if mine else None
    second = max(ref.values(), key=lambda s: _weight(s, s.run)) if ref else None
    return first, second, first is None or second is None


def _weight(summary: SystemSummary, run: str) -> tuple[int, int, str]:
    """How much a run's figure counts: repeated passes, prompts, then recency (the label)."""
    return (max(len(summary.tpot_by_run), 1), summary.prompts, run)


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
    limits = {t.name: t.limit for t in targets}
    rows = [
        [
            t["model"],
            t["budget"],
            t["target"],
            t["tpot_ms"],
            t["versus_tpot_ms"],
            t["ratio"],
            _per_run_text(t["per_run"]),
            _status(t, limits.get(t["target"])),
            t["acceptance_rate"],
            ", ".join(f"{r:.2f}" for r in t["recent"]) if len(t["recent"]) > 1 else "-",
        ]
        for t in evaluated
    ]
    headers = [
        "model", "budget", "target", "TPOT ms", "versus ms", "ratio", "per run (worst)",
        "status", "acceptance", f"last runs (up to {RECENT_RUNS})",
    ]  # fmt: skip
    if any(t["source"] for t in evaluated):
        headers.append("source")
        rows = [[*row, t["source"] or "-"] for row, t in zip(rows, evaluated, strict=True)]
    return markdown_table(headers, rows)


def _per_run_text(ratios: dict[int, float]) -> str:
    """``"0.61, 0.66, 0.64 (worst 0.66)"``: a run's repeated passes' ratios, ``-`` without."""
    if not ratios:
        return "-"
    return f"{', '.join(f'{r:.2f}' for r in ratios.values())} (worst {max(ratios.values()):.2f})"


def _status(target: dict[str, Any], limit: float | None = None) -> str:
    if target["ratio"] is None:
        return "not measured"
    runs = "" if target.get("same_run", True) else " (two runs)"
    if target["met"] is None:
        return "-" + runs
    paired = target.get("per_run") or {}
    if paired:
        verdict = "met" if target["met"] else "NOT met"
        return f"{verdict} at the worst of {len(paired)} runs"
    recent = target.get("recent") or []
    if limit is not None and len(recent) > 1:
        met = sum(1 for r in recent if r <= limit)
        if 0 < met < len(recent):  # the runs disagree: say how often it was met
            return f"met in {met} of the last {len(recent)} runs"
    return ("met" if target["met"] else "NOT met") + runs
