"""Replay a routing trace through a replacement policy and count loads.

The replay drives a real ``ExpertCache`` on the CPU over a store of one-element experts, so
the counts are exactly what the cache would do with that policy (same acquire and prefetch
logic), not a model of it. ``compare_policies`` puts LRU, LFU, predictive and the Belady bound
side by side on one trace.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from specter_cache.belady import Trace, _per_layer, belady_loads
from specter_cache.expert_cache import ExpertCache
from specter_cache.expert_layout import ExpertLayout
from specter_cache.expert_store import ExpertStore
from specter_cache.replacement_policy import ReplacementPolicy, make_policy

Plans = Sequence[Sequence[Sequence[int]]]
"""``plans[layer][step]`` = ranked experts predicted (and prefetched) before that step."""


@dataclass(frozen=True)
class SimulationResult:
    """Counts of one replay.

    Attributes:
        policy: policy name.
        accesses: needed (layer, step, expert) triples.
        hits: accesses found resident.
        demand_loads: loads made on demand.
        prefetch_loads: loads made by prefetching a plan.
        prefetch_used: prefetched experts used before eviction.
        waves: waves handed out.
    """

    policy: str
    accesses: int
    hits: int
    demand_loads: int
    prefetch_loads: int
    prefetch_used: int
    waves: int

    @property
    def loads(self) -> int:
        """All loads: demand plus prefetch."""
        return self.demand_loads + self.prefetch_loads

    @property
    def hit_rate(self) -> float | None:
        """hits / accesses."""
        return self.hits / self.accesses if self.accesses else None

    def as_dict(self) -> dict[str, object]:
        """Fields plus ``loads`` and ``hit_rate``."""
        return {**asdict(self), "loads": self.loads, "hit_rate": self.hit_rate}


def windowed_trace(routing: torch.Tensor, window: int = 1) -> list[list[frozenset[int]]]:
    """``trace[layer][step]``: the experts a ``[T, L, k]`` routing needs per step of
    ``window`` tokens (a trailing partial window is kept).

    ``window=1`` is token-by-token decoding; ``window=K+1`` approximates verifying K
    proposals at once.

    Raises:
        ValueError: ``routing`` is not ``[T, L, k]`` or ``window`` < 1.
    """
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be an int >= 1, got {window!r}.")
    if not isinstance(routing, torch.Tensor) or routing.dim() != 3:
        shape = tuple(routing.shape) if isinstance(routing, torch.Tensor) else type(routing)
        raise ValueError(f"routing must be a [T, L, k] tensor of expert ids, got {shape}")
    T, L, _ = routing.shape
    per_layer = routing.permute(1, 0, 2).tolist()  # [L][T][k]
    return [
        [frozenset(e for row in per_layer[layer][s : s + window] for e in row)
         for s in range(0, T, window)]
        for layer in range(L)
    ]  # fmt: skip


def _num_experts(trace: Trace, plans: Plans | None) -> int:
    top = -1
    for steps in trace:
        for needed in steps:
            top = max([top, *needed])
    if plans is not None:
        for steps in plans:
            for plan in steps:
                top = max([top, *plan])
    return top + 1


def simulate_policy(
    trace: Trace,
    policy: str | ReplacementPolicy,
    slots_per_layer: int | Sequence[int],
    *,
    num_experts: int | None = None,
    plans: Plans | None = None,
    pinned: Sequence[Sequence[int]] | None = None,
) -> SimulationResult:
    """Replay ``trace`` through an ``ExpertCache`` with ``policy`` and count.

    Each step of each layer is one ``acquire`` of the step's experts (waves released as they
    come). With ``plans``, before each step the layer's plan is handed to the policy and
    prefetched, as ``SpeculativePrefetcher`` would; unused prefetches expire after the step.
    With ``pinned``, each layer's pinned experts are loaded and pinned before the replay
    (``ExpertCache.pin``; those loads are setup and not counted), and the policy evicts among
    the other slots.

    Args:
        trace: ``trace[layer][step]`` = experts needed.
        policy: a policy name or a fresh ``ReplacementPolicy``.
        slots_per_layer: one slot count or one per layer.
        num_experts: experts per layer (default: the largest id seen + 1).
        plans: optional ``plans[layer][step]`` (same shape as ``trace``).
        pinned: optional ``pinned[layer]`` = experts kept resident throughout.

    Raises:
        ValueError: mismatched shapes, bad ids or slot counts.
    """
    num_layers = len(trace)
    if num_layers == 0:
        raise ValueError("trace has no layers")
    if plans is not None and (
        len(plans) != num_layers or any(len(p) != len(t) for p, t in zip(plans, trace, strict=True))
    ):
        raise ValueError("plans must have the trace's shape: plans[layer][step]")
    E = num_experts if num_experts is not None else max(1, _num_experts(trace, plans))
    slots = [min(s, E) for s in _per_layer(slots_per_layer, num_layers)]
    store = ExpertStore(num_layers, E, ExpertLayout({"id": ((1,), torch.int32)}), pin_memory=False)
    for layer in range(num_layers):
        for e in range(E):
            store.put(layer, e, {"id": torch.tensor([e], dtype=torch.int32)})
    pol = make_policy(policy)
    cache = ExpertCache(store, slots_per_layer=slots, device="cpu", policy=pol)
    if pinned is not None:
        if len(pinned) != num_layers:
            raise ValueError(f"pinned needs one list per layer ({num_layers}), got {len(pinned)}")
        for layer, experts in enumerate(pinned):
            cache.pin(layer, experts)
        cache.reset_stats()
    accesses = 0
    for t in range(max(len(steps) for steps in trace)):
        for layer, steps in enumerate(trace):
            if t >= len(steps):
                continue
            if plans is not None:
                plan = {layer: list(plans[layer][t])}
                cache.set_plan(plan)
                cache.prefetch(plan)
            needed = sorted(set(steps[t]))
            accesses += len(needed)
            for wave in cache.acquire(layer, needed):
                wave.release()
        if plans is not None:
            cache.expire_prefetches()
    total = cache.stats()["total"]
    return SimulationResult(
        policy=pol.name,
        accesses=accesses,
        hits=total["hits"],  # type: ignore[arg-type]
        demand_loads=total["demand_loads"],  # type: ignore[arg-type]
        prefetch_loads=total["prefetch_loads"],  # type: ignore[arg-type]
        prefetch_used=total["prefetch_used"],  # type: ignore[arg-type]
        waves=total["waves"],  # type: ignore[arg-type]
    )


def compare_policies(
    trace: Trace,
    slots_per_layer: int | Sequence[int],
    *,
    policies: Sequence[str] = ("lru", "lfu", "predictive"),
    plans: Plans | None = None,
    num_experts: int | None = None,
) -> dict[str, dict[str, object]]:
    """LRU, LFU, predictive (with ``plans`` prefetched) and Belady on one trace.

    ``plans`` are used by the ``"predictive"`` policy only (the others run on demand).

    Returns:
        ``name -> SimulationResult.as_dict()``, plus ``"belady"`` with ``loads`` and
        ``hit_rate`` (accesses that need no load under the optimal schedule).
    """
    out: dict[str, dict[str, object]] = {}
    for name in policies:
        res = simulate_policy(
            trace,
            name,
            slots_per_layer,
            num_experts=num_experts,
            plans=plans if name == "predictive" else None,
        )
        out[name] = res.as_dict()
    accesses = sum(len(set(s)) for steps in trace for s in steps)
    loads = belady_loads(trace, slots_per_layer)
    out["belady"] = {
        "policy": "belady",
        "accesses": accesses,
        "loads": loads,
        "hit_rate": (accesses - loads) / accesses if accesses else None,
    }
    return out
