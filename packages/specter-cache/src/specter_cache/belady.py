"""Belady's rule: the fewest expert loads any policy could make on a known future trace.

The model is the cache's: at each step a layer needs a set of experts; each must be resident
at some instant during the step (a layer that needs more experts than it has slots computes in
waves); every load costs one. Serving the step's resident experts first and then loading each
missing one, evicting the resident expert whose next need lies farthest in the future, makes
the fewest loads (Belady 1966, with the step's order chosen hits-first; the tests check it
against an exhaustive search on small traces). Prefetching cannot beat it: any schedule with
prefetches can be turned into an on-demand one with no more loads.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Sequence

Trace = Sequence[Sequence[Collection[int]]]
"""``trace[layer][step]`` = the experts that layer needs at that step."""


def belady_layer_loads(steps: Sequence[Collection[int]], slots: int) -> int:
    """Fewest loads for one layer's sequence of needed-expert sets with ``slots`` slots.

    Args:
        steps: ``steps[t]`` = experts needed at step ``t``.
        slots: slots of the layer (>= 1).

    Returns:
        The minimum number of loads, starting from an empty cache.

    Raises:
        ValueError: ``slots`` < 1.

    Example:
        >>> belady_layer_loads([{0}, {1}, {2}, {0}, {1}], slots=2)
        4
    """
    if not isinstance(slots, int) or slots < 1:
        raise ValueError(f"slots must be a positive int, got {slots!r}")
    sets = [set(s) for s in steps]
    uses: dict[int, list[int]] = {}
    for t, needed in enumerate(sets):
        for e in needed:
            uses.setdefault(e, []).append(t)

    def next_use(expert: int, t: int) -> float:
        times = uses[expert]
        i = bisect.bisect_right(times, t)
        return times[i] if i < len(times) else float("inf")

    cache: set[int] = set()
    loads = 0
    for t, needed in enumerate(sets):
        # Hits are served first; every expert left in the cache is done for this step.
        for e in sorted(needed - cache):
            if len(cache) >= slots:
                victim = max(cache, key=lambda x: (next_use(x, t), x))
                cache.remove(victim)
            cache.add(e)
            loads += 1
    return loads


def belady_loads(trace: Trace, slots_per_layer: int | Sequence[int]) -> int:
    """Fewest loads over all layers of ``trace`` (layers are independent).

    Args:
        trace: ``trace[layer][step]`` = experts needed.
        slots_per_layer: one slot count for all layers or one per layer.

    Raises:
        ValueError: a slot list of the wrong length or a slot count < 1.
    """
    slots = _per_layer(slots_per_layer, len(trace))
    return sum(belady_layer_loads(steps, s) for steps, s in zip(trace, slots, strict=True))


def _per_layer(slots_per_layer: int | Sequence[int], num_layers: int) -> list[int]:
    if isinstance(slots_per_layer, int):
        return [slots_per_layer] * num_layers
    slots = list(slots_per_layer)
    if len(slots) != num_layers:
        raise ValueError(f"need {num_layers} slot counts (one per layer), got {slots}")
    return slots
