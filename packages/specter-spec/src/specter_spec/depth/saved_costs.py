"""The costs an adaptive depth policy exports, read back to prime another one."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["SavedCosts", "read_saved_costs"]


def _primed_time(value: Any, name: str) -> float | None:
    """``value`` as seconds (None stays None) for :func:`read_saved_costs`."""
    if value is None:
        return None
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
    return float(value)


def _primed_age(value: Any, name: str) -> int | None:
    """``value`` as iterations since a measurement (None stays None)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an int >= 0 (iterations), got {value!r}")
    return value


def _primed_table(
    values: Any, where: str, lowest: int, highest: int, parse: Callable[[Any, str], Any]
) -> dict[int, Any]:
    """``{count: parse(value)}`` of the mapping ``values`` found at ``where`` (keys may be
    strings, as JSON writes them; counts in ``[lowest, highest]``; None values left out)."""
    if not isinstance(values, Mapping):
        raise ValueError(f"{where} must be a mapping of counts, got {values!r}")
    out = {}
    for key, value in values.items():
        try:
            count = int(key)
        except (TypeError, ValueError):
            count = None
        if count is None or str(count) != str(key).strip() or not lowest <= count <= highest:
            raise ValueError(f"{where} has count {key!r}; expected an int in [{lowest}, {highest}]")
        parsed = parse(value, f"{where}[{key!r}]")
        if parsed is not None:
            out[count] = parsed
    return out


@dataclass(frozen=True)
class SavedCosts:
    """Costs read from :meth:`AdaptiveDepth.export_costs`'s mapping, checked.

    Attributes:
        draft: ``{K: seconds}`` decaying mean draft time of each depth K >= 1.
        verify: ``{rows: seconds}`` decaying mean verify time of each row count.
        draft_ages, verify_ages: iterations since each of those was last measured.
        plain_overhead, speculative_overhead: per-iteration time outside drafting and
            verifying, of plain and of speculative iterations (None where not measured).
        steady_plain: a pipelined plain step's time (None where not measured).
        steady_plain_age: iterations since it was last measured (None where unknown).
    """

    draft: dict[int, float]
    verify: dict[int, float]
    draft_ages: dict[int, int]
    verify_ages: dict[int, int]
    plain_overhead: float | None
    speculative_overhead: float | None
    steady_plain: float | None
    steady_plain_age: int | None


def read_saved_costs(costs: Any, max_depth: int) -> SavedCosts:
    """Check and read ``costs`` (:meth:`AdaptiveDepth.export_costs`'s mapping, or its JSON)
    for a policy whose deepest depth is ``max_depth``.

    Raises:
        ValueError: ``costs`` is not a mapping, or holds a depth below 1 or above
            ``max_depth``, a row count below 1 or above ``max_depth + 1``, a time that is
            not a finite number >= 0 or an age that is not an int >= 0.
    """
    if not isinstance(costs, Mapping):
        raise ValueError(f"costs must be a mapping (export_costs()), got {type(costs).__name__}")
    top, rows = max_depth, max_depth + 1
    draft = _primed_table(costs.get("draft", {}), "costs['draft']", 1, top, _primed_time)
    verify = _primed_table(costs.get("verify", {}), "costs['verify']", 1, rows, _primed_time)
    overhead = costs.get("overhead") or {}
    if not isinstance(overhead, Mapping):
        raise ValueError(f"costs['overhead'] must be a mapping, got {overhead!r}")
    plain = _primed_time(overhead.get("plain"), "overhead plain")
    speculative = _primed_time(overhead.get("speculative"), "overhead speculative")
    steady = _primed_time(costs.get("steady_plain"), "steady_plain")
    ages = costs.get("ages") or {}
    if not isinstance(ages, Mapping):
        raise ValueError(f"costs['ages'] must be a mapping, got {ages!r}")
    draft_ages = _primed_table(
        ages.get("draft") or {}, "costs['ages']['draft']", 1, top, _primed_age
    )
    verify_ages = _primed_table(
        ages.get("verify") or {}, "costs['ages']['verify']", 1, rows, _primed_age
    )
    steady_age = _primed_age(ages.get("steady_plain"), "ages steady_plain")
    return SavedCosts(
        draft=draft,
        verify=verify,
        draft_ages=draft_ages,
        verify_ages=verify_ages,
        plain_overhead=plain,
        speculative_overhead=speculative,
        steady_plain=steady,
        steady_plain_age=steady_age,
    )
