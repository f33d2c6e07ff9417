"""PNG plots of benchmark records: TPOT per system, working set against K, hit rate per
policy, the depth sweep, throughput and TPOT against the batch size.

Figures are built with ``matplotlib.figure.Figure`` and its Agg canvas, never through
``pyplot``: no display, no global state, safe on a headless GPU machine. Each ``plot_*``
returns the figure (one subplot per model) so callers and tests can inspect what was drawn;
:func:`save_png` writes it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from specter_bench.bench_record import budget_label
from specter_bench.table_format import system_order
from specter_bench.tpot_tables import summarize_tpot

__all__ = [
    "plot_batch",
    "plot_depth_sweep",
    "plot_policy_hit_rate",
    "plot_tpot_per_system",
    "plot_working_set",
    "save_png",
]

POLICIES = ("lru", "lfu", "predictive", "belady")


def _figure(panels: int, title: str) -> tuple[Figure, list[Any]]:
    if panels < 1:
        raise ValueError(f"no data to plot for {title!r}; the records hold none of its kind.")
    fig = Figure(figsize=(6.0 * panels, 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(1, panels, i + 1) for i in range(panels)]
    fig.suptitle(title)
    return fig, axes


def _budget_order(budgets: Iterable[float | None]) -> list[float | None]:
    return sorted(set(budgets), key=lambda b: (b is None, b or 0.0))


def _grouped_bars(ax: Any, groups: Sequence[str], series: dict[str, list[float | None]]) -> None:
    """Bars of each series side by side in each group; missing values draw nothing (NaN)."""
    width = 0.8 / max(1, len(series))
    for i, (label, values) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        heights = [float("nan") if v is None else v for v in values]
        ax.bar(xs, heights, width=width, label=label)
    ax.set_xticks(range(len(groups)), groups)
    # Below the axes: a legend inside would cover the bars.
    ax.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3)


def plot_tpot_per_system(records: Iterable[dict[str, Any]]) -> Figure:
    """Mean TPOT (ms) per system (bars) per budget (groups), one panel per model.

    Raises:
        ValueError: no ``tpot`` records.
    """
    summaries = summarize_tpot(records)
    models = sorted({s.model for s in summaries})
    fig, axes = _figure(len(models), "TPOT per system (lower is better)")
    for ax, model in zip(axes, models, strict=True):
        mine = [s for s in summaries if s.model == model]
        budgets = _budget_order(s.budget_gb for s in mine)
        systems = sorted({s.system for s in mine}, key=system_order)
        index = {(s.budget_gb, s.system): s.tpot_ms for s in mine}
        series = {sys_: [index.get((b, sys_)) for b in budgets] for sys_ in systems}
        _grouped_bars(ax, [budget_label(b) for b in budgets], series)
        values = [v for vs in series.values() for v in vs if v]
        if values and max(values) > 20 * min(values):
            ax.set_yscale("log")  # hf-offload is orders of magnitude slower than the rest
        ax.set_title(model)
        ax.set_ylabel("TPOT (ms)")
        ax.set_xlabel("GPU memory budget")
    return fig


def plot_working_set(records: Iterable[dict[str, Any]]) -> Figure:
    """Distinct experts per layer against depth K: mean line and p10-p90 band per model.

    Raises:
        ValueError: no ``working_set`` records.
    """
    recs = [r for r in records if r.get("kind") == "working_set"]
    models = sorted({r["model"] for r in recs})
    fig, axes = _figure(len(models), "Expert working set against speculation depth")
    for ax, model in zip(axes, models, strict=True):
        for r in (r for r in recs if r["model"] == model):
            curve = r["data"]["curve"]
            depths = [p["depth"] for p in curve]
            label = r["data"].get("routing", "target")
            ax.plot(depths, [p["mean"] for p in curve], marker="o", label=f"{label} mean")
            ax.fill_between(
                depths, [p["p10"] for p in curve], [p["p90"] for p in curve], alpha=0.25
            )
        ax.set_xscale("log", base=2)
        ticks = sorted(
            {p["depth"] for r in recs if r["model"] == model for p in r["data"]["curve"]}
        )
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_title(model)
        ax.set_xlabel("speculation depth K (tokens)")
        ax.set_ylabel("distinct experts per layer")
        ax.legend(fontsize="small")
    return fig


def plot_policy_hit_rate(records: Iterable[dict[str, Any]]) -> Figure:
    """Cache hit rate (%) per policy (bars) per budget (groups), one panel per model.

    With several windows recorded for a (model, budget), the largest (speculation) is drawn.

    Raises:
        ValueError: no ``policy_hit_rate`` records.
    """
    recs = [r for r in records if r.get("kind") == "policy_hit_rate"]
    models = sorted({r["model"] for r in recs})
    fig, axes = _figure(
        len(models), "Expert cache hit rate per policy (Belady: the optimal on-demand schedule)"
    )
    for ax, model in zip(axes, models, strict=True):
        chosen: dict[float | None, dict[str, Any]] = {}
        for r in (r for r in recs if r["model"] == model):
            window = r["data"].get("window", 1)
            if r["budget_gb"] not in chosen or window > chosen[r["budget_gb"]].get("window", 1):
                chosen[r["budget_gb"]] = r["data"]
        budgets = _budget_order(chosen)
        series: dict[str, list[float | None]] = defaultdict(list)
        for policy in POLICIES:
            for b in budgets:
                rate = chosen[b]["policies"].get(policy, {}).get("hit_rate")
                series[policy].append(None if rate is None else 100.0 * rate)
        _grouped_bars(ax, [budget_label(b) for b in budgets], dict(series))
        ax.set_ylim(0, 100)
        ax.set_title(model)
        ax.set_ylabel("hit rate (%)")
        ax.set_xlabel("GPU memory budget")
    return fig


def plot_depth_sweep(records: Iterable[dict[str, Any]]) -> Figure:
    """TPOT against depth K, one line per budget, one panel per model; best depth starred.

    Raises:
        ValueError: no ``depth_sweep`` records.
    """
    recs = [r for r in records if r.get("kind") == "depth_sweep"]
    models = sorted({r["model"] for r in recs})
    fig, axes = _figure(len(models), "Depth sweep: TPOT against speculation depth")
    for ax, model in zip(axes, models, strict=True):
        mine = sorted(
            (r for r in recs if r["model"] == model),
            key=lambda r: (r["budget_gb"] is None, r["budget_gb"] or 0.0),
        )
        for r in mine:
            points = sorted(r["data"]["points"], key=lambda p: p["depth"])
            depths = [p["depth"] for p in points]
            (line,) = ax.plot(
                depths,
                [p["tpot_ms"] for p in points],
                marker="o",
                label=budget_label(r["budget_gb"]),
            )
            best = r["data"].get("best_depth")
            for p in points:
                if p["depth"] == best:
                    ax.plot(
                        [best], [p["tpot_ms"]], marker="*", markersize=14, color=line.get_color()
                    )
        ax.set_title(model)
        ax.set_xlabel("speculation depth K")
        ax.set_ylabel("TPOT (ms)")
        ax.legend(fontsize="small")
    return fig


def plot_batch(records: Iterable[dict[str, Any]]) -> Figure:
    """Decode throughput and mean TPOT against the batch size B, one line per system (and
    budget), two panels per model; a cell measured in several runs draws its latest.

    Raises:
        ValueError: no ``batch`` records.
    """
    from specter_bench.batch_tables import summarize_batch

    latest: dict[tuple[str, float | None, str, int], Any] = {}
    for s in summarize_batch(records):  # sorted by run within a cell: the last is the latest
        latest[(s.model, s.budget_gb, s.system, s.batch_size)] = s
    models = sorted({key[0] for key in latest})
    fig, axes = _figure(2 * len(models), "Batched decoding: throughput and TPOT against B")
    for i, model in enumerate(models):
        rate_ax, tpot_ax = axes[2 * i], axes[2 * i + 1]
        lines = sorted(
            {(budget, system) for (m, budget, system, _) in latest if m == model},
            key=lambda line: (line[0] is None, line[0] or 0.0, system_order(line[1])),
        )
        budgets = {budget for budget, _ in lines}
        sizes: set[int] = set()
        for budget, system in lines:
            cells = sorted(
                (size, s)
                for (m, b, sys_, size), s in latest.items()
                if (m, b, sys_) == (model, budget, system)
            )
            sizes.update(size for size, _ in cells)
            label = system if len(budgets) == 1 else f"{system} ({budget_label(budget)})"
            xs = [size for size, _ in cells]
            nan = float("nan")
            rate_ax.plot(xs, [nan if s.throughput is None else s.throughput for _, s in cells],
                         marker="o", label=label)  # fmt: skip
            tpot_ax.plot(xs, [nan if s.mean_tpot_ms is None else s.mean_tpot_ms for _, s in cells],
                         marker="o", label=label)  # fmt: skip
        where = ", ".join(budget_label(b) for b in _budget_order(budgets))
        for ax, ylabel in ((rate_ax, "decode throughput (tokens/s)"),
                           (tpot_ax, "mean TPOT per sequence (ms)")):  # fmt: skip
            ax.set_xscale("log", base=2)
            ticks = sorted(sizes)
            ax.set_xticks(ticks, [str(t) for t in ticks])
            ax.set_xlabel("batch size B")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{model} ({where})")
            ax.legend(fontsize="small")
    return fig


def save_png(fig: Figure, path: str | Path) -> Path:
    """Write ``fig`` as a PNG (creating the folder) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=110)
    return path
