"""The Belady bound on TPOT and the policy comparison, from a recorded target routing.

docs/benchmarking.md's bound: from the target's routing trace, the fewest expert loads any policy
could make with the run's slots (Belady's rule, ``specter_cache.belady_loads``), times the
measured per-expert transfer time, per generated token. A system's TPOT over this bound says
how close it comes to moving only what it must.

The trace is the committed tokens' routing, one step per token: any system must route each
committed token through its experts, and computing several tokens at once (verification)
never needs fewer loads than token by token when the step fits the slots. Decoding starts
after the prefill, which leaves the cache full; the bound gives that start for free
(``warm_start``): each layer begins holding the first experts its trace needs, as many as it
has slots, which is where Belady's rule would have put them.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch

from specter_bench.routing_analysis import draft_plans, routing_trace
from specter_cache import ExpertStore, simulate_policy
from specter_cache.belady import belady_layer_loads
from specter_cache.trace_simulation import compare_policies

__all__ = [
    "BeladyBound",
    "belady_bound",
    "measure_expert_transfer_s",
    "policy_hit_rates",
    "warm_belady_loads",
]


def _slots_list(slots_per_layer: int | Sequence[int], num_layers: int) -> list[int]:
    slots = (
        [slots_per_layer] * num_layers
        if isinstance(slots_per_layer, int)
        else list(slots_per_layer)
    )
    if len(slots) != num_layers or any(
        isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in slots
    ):
        raise ValueError(
            f"slots_per_layer must be a positive int or {num_layers} of them (one per MoE "
            f"layer), got {slots_per_layer!r}."
        )
    return slots


def warm_belady_loads(
    trace: Sequence[Sequence[frozenset[int] | set[int]]], slots_per_layer: int | Sequence[int]
) -> int:
    """Belady's fewest loads when each layer starts holding its first needed experts for free.

    A virtual first step needs the first ``S`` distinct experts of the layer's trace (in
    order of first use); its loads are then subtracted.

    Args:
        trace: ``trace[layer][step]`` = experts needed.
        slots_per_layer: one slot count or one per layer.

    Raises:
        ValueError: bad slot counts.
    """
    slots = _slots_list(slots_per_layer, len(trace))
    total = 0
    for steps, s in zip(trace, slots, strict=True):
        first: list[int] = []
        for needed in steps:
            for e in sorted(needed):
                if e not in first and len(first) < s:
                    first.append(e)
        loads = belady_layer_loads([frozenset(first), *steps], s) if first else 0
        total += loads - len(first)
    return total


@dataclass(frozen=True)
class BeladyBound:
    """The bound of one (model, budget, prompt).

    Attributes:
        slots_per_layer: the slots the bound was computed with.
        accesses: (token, layer, expert) needs in the trace.
        loads: Belady's fewest loads (warm start).
        expert_transfer_s: measured host-to-device time of one expert.
        generated_tokens: tokens the trace covers.
        tpot_ms: ``loads * expert_transfer_s / generated_tokens`` in milliseconds.
    """

    slots_per_layer: list[int]
    accesses: int
    loads: int
    expert_transfer_s: float
    generated_tokens: int
    tpot_ms: float

    def as_dict(self) -> dict[str, object]:
        """Plain-Python view, for JSON."""
        return asdict(self)


def belady_bound(
    target_routing: torch.Tensor,
    slots_per_layer: int | Sequence[int],
    expert_transfer_s: float,
) -> BeladyBound:
    """Belady's bound on TPOT for decoding the tokens of ``target_routing``.

    Args:
        target_routing: ``[T, L, k]`` the target's routing of the ``T`` decode steps (the
            input of each step: the last prompt token, then each generated token but the last).
        slots_per_layer: the run's slots (one value or one per MoE layer).
        expert_transfer_s: measured seconds to move one expert host-to-device (> 0).

    Raises:
        ValueError: bad slots or a non-positive transfer time.

    Example:
        >>> r = torch.tensor([[[0]], [[1]], [[0]], [[2]]])  # 4 tokens, 1 layer, top-1
        >>> belady_bound(r, 1, 0.001).loads  # 0 starts resident; then 1, 0, 2
        3
    """
    if not expert_transfer_s > 0:
        raise ValueError(f"expert_transfer_s must be > 0 seconds, got {expert_transfer_s!r}.")
    trace = routing_trace(target_routing, window=1)
    slots = _slots_list(slots_per_layer, len(trace))
    loads = warm_belady_loads(trace, slots)
    tokens = target_routing.shape[0]
    return BeladyBound(
        slots_per_layer=slots,
        accesses=sum(len(s) for steps in trace for s in steps),
        loads=loads,
        expert_transfer_s=float(expert_transfer_s),
        generated_tokens=tokens,
        tpot_ms=1e3 * loads * expert_transfer_s / tokens,
    )


def policy_hit_rates(
    target_routing: torch.Tensor,
    slots_per_layer: int | Sequence[int],
    *,
    draft_routing: torch.Tensor | None = None,
    window: int = 1,
    num_experts: int | None = None,
    pinned: Sequence[Sequence[int]] | None = None,
    pinned_slots: int | Sequence[int] | None = None,
) -> dict[str, dict[str, object]]:
    """Hit rate of LRU, LFU, predictive (draft-planned) and Belady on one recorded routing.

    Every policy replays the same steps (``window`` tokens each) through a real
    ``ExpertCache`` (``specter_cache.compare_policies``). The predictive policy is given,
    before each step, the draft's ranked experts for that step's tokens (prefetched, up to
    the layer's slots); without ``draft_routing`` it is left out.

    Args:
        target_routing: ``[T, L, k]`` target routing.
        slots_per_layer: slots per layer.
        draft_routing: ``[T, L, k]`` draft routing of the same tokens, or None.
        window: tokens per step (1: plain decoding; K + 1: one verification of K proposals).
        num_experts: experts per layer (default: the largest id seen + 1).
        pinned: ``pinned[layer]`` experts kept resident, for a ``pinned`` entry: LRU over
            the other slots of ``pinned_slots`` (a configuration with its own slot count).
        pinned_slots: slots per layer of the ``pinned`` configuration (default: ``slots``).

    Returns:
        ``policy -> {"hit_rate", "loads", "accesses", ...}`` for ``lru``, ``lfu``,
        ``predictive`` (with a draft), ``pinned`` (with ``pinned``) and ``belady`` (cold
        start, as the policies); with ``pinned`` also ``belady_pinned_slots``: Belady at the
        pinned configuration's slots, each layer starting with its first needed experts
        resident (as the bound does, and as the pinned experts start loaded), so the online
        policy a system runs and the fewest loads at its own slots sit side by side.

    Raises:
        ValueError: shapes or slots that do not fit.
    """
    trace = routing_trace(target_routing, window)
    slots = _slots_list(slots_per_layer, len(trace))
    policies: tuple[str, ...] = ("lru", "lfu")
    plans = None
    if draft_routing is not None:
        if tuple(draft_routing.shape) != tuple(target_routing.shape):
            raise ValueError(
                f"draft routing {tuple(draft_routing.shape)} must match target routing "
                f"{tuple(target_routing.shape)}."
            )
        plans = draft_plans(draft_routing, window, top_m=slots)
        policies = (*policies, "predictive")
    out = compare_policies(trace, slots, policies=policies, plans=plans, num_experts=num_experts)
    if pinned is not None:
        pinned_plan = slots if pinned_slots is None else _slots_list(pinned_slots, len(trace))
        out["pinned"] = simulate_policy(
            trace, "lru", pinned_plan, num_experts=num_experts, pinned=pinned
        ).as_dict()
        accesses = out["belady"]["accesses"]  # the same trace's needs
        loads = warm_belady_loads(trace, pinned_plan)
        out["belady_pinned_slots"] = {
            **out["belady"],
            "loads": loads,
            "hit_rate": (accesses - loads) / accesses if accesses else None,
            "warm_start": True,
        }
    return out


def measure_expert_transfer_s(
    store: ExpertStore, device: torch.device | str, *, layer: int = 0, repeats: int = 16
) -> float:
    """Median host-to-device time of one expert of ``store`` (all its tensors), in seconds.

    Copies experts ``0, 1, ...`` of ``layer`` (cycling) into one device buffer, timed with
    CUDA events on a CUDA device (pinned sources copy asynchronously, as the cache's copies
    do), with the host clock elsewhere. One warm-up copy is not counted.

    Args:
        store: the host expert store.
        device: where the cache lives.
        layer: which layer's experts to move.
        repeats: timed copies (>= 1).

    Raises:
        ValueError: ``repeats`` < 1.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}.")
    device = torch.device(device)
    sources = [store.get(layer, e % store.num_experts) for e in range(repeats + 1)]
    buffers = {name: torch.empty_like(t, device=device) for name, t in sources[0].items()}
    times: list[float] = []
    for i, src in enumerate(sources):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for name, t in src.items():
                buffers[name].copy_(t, non_blocking=True)
            end.record()
            end.synchronize()  # measurement, outside any decode loop
            seconds = start.elapsed_time(end) / 1e3
        else:
            started = time.perf_counter()
            for name, t in src.items():
                buffers[name].copy_(t)
            seconds = time.perf_counter() - started
        if i > 0:
            times.append(seconds)
    return statistics.median(times)
