"""Repeated runs of a cell (``specter bench --runs N``): each run's figure, their median and
range, and whether a target ratio holds at the worst run.

A cell is one (model, budget, system) of one ``specter bench`` process; its decodes carry a
``run_index`` (records written before repeated runs have none: run 0). A run's TPOT is the
median over its prompts; the cell's TPOT is the median of its runs' TPOTs, shown with their
minimum and maximum. A ratio of two cells of one process is computed per run, pairing
the runs by index (run i of the numerator over run i of the denominator: the two ran
close together, on the same prompts), and a target ``ratio <= limit`` holds only where it
holds at every pair, that is at the worst run: one good run among three is not a result.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RatioCheck", "median_range", "per_run", "ratio_holds"]


def per_run(records: Iterable[dict[str, Any]], key: str = "tpot_ms") -> dict[int, float]:
    """``{run_index: median of key over that run's records}`` (records without the key's
    value left out; a record without ``run_index`` is run 0)."""
    values: dict[int, list[float]] = defaultdict(list)
    for r in records:
        value = r.get(key)
        if value is not None:
            values[int(r.get("run_index") or 0)].append(float(value))
    return {i: statistics.median(v) for i, v in sorted(values.items())}


def median_range(values: Iterable[float]) -> tuple[float, float, float] | None:
    """``(median, min, max)`` of ``values``; None without any."""
    kept = [float(v) for v in values]
    if not kept:
        return None
    return statistics.median(kept), min(kept), max(kept)


@dataclass(frozen=True)
class RatioCheck:
    """A target ratio checked run by run.

    Attributes:
        limit: the target (``ratio <= limit``).
        ratios: ``{run_index: numerator / denominator}`` of the runs both sides have.
        holds: every paired ratio is within the limit (None: no pair, or no limit).
    """

    limit: float | None
    ratios: dict[int, float] = field(default_factory=dict)
    holds: bool | None = None

    @property
    def worst(self) -> float | None:
        """The largest paired ratio (the worst run for a ``<=`` target)."""
        return max(self.ratios.values()) if self.ratios else None

    @property
    def median(self) -> float | None:
        """The median paired ratio."""
        return statistics.median(self.ratios.values()) if self.ratios else None


def ratio_holds(
    target: Any, numerator_runs: Mapping[int, float], denominator_runs: Mapping[int, float]
) -> RatioCheck:
    """Whether ``numerator / denominator <= target`` holds at the worst run.

    Args:
        target: the limit, or an object with a ``limit`` (``target_tables.Target``); a NaN
            limit (a ratio quoted without a target) checks nothing.
        numerator_runs, denominator_runs: ``{run_index: TPOT}`` of the two cells
            (:func:`per_run`); runs are paired by index, and a run one side lacks is left
            out.

    Returns:
        The paired ratios and whether every one holds (None without a pair or a limit).
    """
    limit = getattr(target, "limit", target)
    limit = None if limit is None or limit != limit else float(limit)
    ratios = {
        i: numerator_runs[i] / denominator_runs[i]
        for i in sorted(set(numerator_runs) & set(denominator_runs))
        if denominator_runs[i]
    }
    holds = None if not ratios or limit is None else all(r <= limit for r in ratios.values())
    return RatioCheck(limit, ratios, holds)
