"""Belady's bound: the fewest expert loads any replacement policy could make on a known trace.

The cache's execution model: at each step a layer needs a set ``R`` of experts. When ``R``
fits in the layer's ``S`` slots, all of ``R`` is resident together while the step computes;
when it does not, the step computes in waves, cycling experts through at least one slot.
Every load costs one.

In interval form: keeping an expert resident from one need to its next is an *interval*; a
need not covered by a kept interval costs a load. Per step there are three points (start,
during, end). Kept intervals ending at the step cover its start, those beginning there cover
its end, and those spanning it cover all three. Capacities: ``S`` at the start and end;
during the step ``S - |R|`` when ``R`` fits (``R`` itself is resident) and ``S - 1`` when it
does not (one slot must cycle). Fewest loads = needs - the most intervals that fit these
capacities. Taking intervals by earliest end whenever they fit maximises that count (a
totally unimodular interval packing); for single-expert steps this is exactly Belady's
farthest-in-future rule.

The value is exact for traces whose steps all fit their slots (tests compare it with an
exhaustive search over every schedule). For steps that overflow, the capacity ``S - 1``
relaxes the wave schedule, so the value stays a lower bound on every policy of the cache.
Prefetching cannot beat it: a prefetched expert is a load like any other.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

Trace = Sequence[Sequence[Collection[int]]]
"""``trace[layer][step]`` = the experts that layer needs at that step."""


def belady_layer_loads(steps: Sequence[Collection[int]], slots: int) -> int:
    """Fewest loads for one layer's sequence of needed-expert sets with ``slots`` slots.

    Args:
        steps: ``steps[t]`` = experts needed at step ``t``.
        slots: slots of the layer (>= 1).

    Returns:
        The minimum number of loads, starting from an empty cache (a lower bound when some
        step needs more experts than ``slots``; see the module docstring).

    Raises:
        ValueError: ``slots`` < 1.

    Example:
        >>> belady_layer_loads([{0}, {1}, {2}, {0}, {1}], slots=2)
        4
    """
    if not isinstance(slots, int) or isinstance(slots, bool) or slots < 1:
        raise ValueError(f"slots must be a positive int, got {slots!r}")
    sets = [frozenset(s) for s in steps]
    # slack[p] = capacity left at point p: 3 points per step (start, during, end).
    slack: list[int] = []
    for needed in sets:
        during = slots - len(needed) if len(needed) <= slots else slots - 1
        slack += [slots, during, slots]
    previous: dict[int, int] = {}
    intervals: list[tuple[int, int]] = []  # (end point, start point), inclusive
    needs = 0
    for t, needed in enumerate(sets):
        needs += len(needed)
        for e in needed:
            if e in previous:
                intervals.append((3 * t, 3 * previous[e] + 2))
            previous[e] = t
    # Earliest end first (shorter first on ties): Belady's rule in interval form.
    intervals.sort(key=lambda iv: (iv[0], -iv[1]))
    kept = 0
    for end, start in intervals:
        if min(slack[start : end + 1]) > 0:
            for p in range(start, end + 1):
                slack[p] -= 1
            kept += 1
    return needs - kept


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
