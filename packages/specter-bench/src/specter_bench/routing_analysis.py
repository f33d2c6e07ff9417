"""What recorded routing says: working set against depth, draft/target agreement, traces.

A *routing* is an integer tensor ``[T, L, k]``: for each of ``T`` consecutive tokens and each
of ``L`` MoE layers, the ``k`` experts the router chose (``routing_recorder`` records it).
From it:

* **working set against depth K**: the distinct experts a layer needs over a window of K
  tokens (what one verification of K proposals needs resident): mean, min, max and the
  10th/90th percentiles over windows and layers, and the mean per layer;
* **draft/target agreement**: per token and layer, the share of the target's ``k`` experts
  that the draft also chose; averaged per layer, per token and per request;
* **traces** for cache replay: ``trace[layer][step]`` = the expert set of a step of ``window``
  tokens, and the draft's ranked predictions of those sets (``plans``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import torch

from specter_cache.trace_simulation import windowed_trace

__all__ = [
    "DEFAULT_DEPTHS",
    "RoutingAgreement",
    "WorkingSet",
    "check_routing",
    "draft_plans",
    "routing_agreement",
    "routing_trace",
    "working_set",
    "working_set_curve",
]

DEFAULT_DEPTHS = (1, 2, 4, 8, 16, 32)
"""Depths of the working-set experiment."""


def check_routing(routing: torch.Tensor, name: str = "routing") -> torch.Tensor:
    """Validate a ``[T, L, k]`` integer routing tensor and return it as int64 on the CPU.

    Raises:
        TypeError: not an integer tensor.
        ValueError: not three-dimensional, empty, or holding negative ids.
    """
    if not isinstance(routing, torch.Tensor):
        raise TypeError(f"{name} must be a [T, L, k] tensor, got {type(routing).__name__}.")
    if routing.dtype.is_floating_point or routing.dtype.is_complex or routing.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer expert ids, got dtype {routing.dtype}.")
    if routing.dim() != 3 or routing.numel() == 0:
        raise ValueError(
            f"{name} must have shape [T, L, k] (tokens, MoE layers, top-k) with no zero size, "
            f"got {tuple(routing.shape)}."
        )
    routing = routing.detach().to("cpu", torch.long)
    if int(routing.min()) < 0:
        raise ValueError(f"{name} holds a negative expert id ({int(routing.min())}).")
    return routing


@dataclass(frozen=True)
class WorkingSet:
    """Distinct experts per layer over windows of ``depth`` tokens.

    Attributes:
        depth: K, the window length in tokens.
        windows: windows measured per layer.
        mean, minimum, maximum, p10, p90: over every (window, layer).
        per_layer_mean: mean over windows, one value per layer.
    """

    depth: int
    windows: int
    mean: float
    minimum: int
    maximum: int
    p10: float
    p90: float
    per_layer_mean: list[float]

    def as_dict(self) -> dict[str, object]:
        """Plain-Python view, for JSON."""
        return asdict(self)


def _distinct_per_window(routing: torch.Tensor, depth: int, stride: int) -> torch.Tensor:
    """``[W, L]`` distinct expert counts of each window of ``depth`` tokens."""
    T, L, _ = routing.shape
    num_experts = int(routing.max()) + 1
    starts = range(0, T - depth + 1, stride)
    onehot = torch.zeros(T, L, num_experts, dtype=torch.bool)
    onehot.scatter_(2, routing, True)
    # Prefix sums over tokens turn each window's union into a difference of two rows.
    prefix = torch.cat([torch.zeros(1, L, num_experts, dtype=torch.int32), onehot.int().cumsum(0)])
    begin = torch.tensor(list(starts))
    counts = prefix[begin + depth] - prefix[begin]  # [W, L, E]
    return (counts > 0).sum(-1)


def working_set(
    routing: torch.Tensor | Sequence[torch.Tensor], depth: int, *, stride: int = 1
) -> WorkingSet:
    """Distinct experts per layer over every window of ``depth`` consecutive tokens.

    Args:
        routing: ``[T, L, k]`` expert ids, or a list of them (one per request: windows never
            span two requests; statistics pool every window).
        depth: window length K (1 <= K <= the shortest T).
        stride: tokens between window starts (1: every window; K: non-overlapping).

    Raises:
        ValueError: ``depth`` outside ``[1, T]``, ``stride`` < 1, or requests with
            different numbers of layers.

    Example:
        >>> r = torch.tensor([[[0, 1]], [[1, 2]], [[3, 4]]])  # T=3, L=1, k=2
        >>> working_set(r, 2).mean  # windows {0,1,2} and {1,2,3,4}
        3.5
    """
    requests = [routing] if isinstance(routing, torch.Tensor) else list(routing)
    if not requests:
        raise ValueError("routing is an empty list; give at least one [T, L, k] tensor.")
    requests = [check_routing(r) for r in requests]
    if len({r.shape[1] for r in requests}) != 1:
        raise ValueError("every request's routing must cover the same MoE layers.")
    T = min(r.shape[0] for r in requests)
    if isinstance(depth, bool) or not isinstance(depth, int) or not 1 <= depth <= T:
        raise ValueError(f"depth must be an int in [1, {T}] (the tokens recorded), got {depth!r}.")
    if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
        raise ValueError(f"stride must be an int >= 1, got {stride!r}.")
    distinct = torch.cat([_distinct_per_window(r, depth, stride) for r in requests]).double()
    flat = distinct.flatten()
    return WorkingSet(
        depth=depth,
        windows=distinct.shape[0],
        mean=float(flat.mean()),
        minimum=int(flat.min()),
        maximum=int(flat.max()),
        p10=float(torch.quantile(flat, 0.1)),
        p90=float(torch.quantile(flat, 0.9)),
        per_layer_mean=[float(v) for v in distinct.mean(0)],
    )


def working_set_curve(
    routing: torch.Tensor | Sequence[torch.Tensor],
    depths: Iterable[int] = DEFAULT_DEPTHS,
    *,
    stride: int = 1,
) -> list[WorkingSet]:
    """:func:`working_set` at each depth not longer than the shortest recording (others skipped)."""
    requests = [routing] if isinstance(routing, torch.Tensor) else list(routing)
    shortest = min(check_routing(r).shape[0] for r in requests) if requests else 0
    return [working_set(requests, d, stride=stride) for d in depths if d <= shortest]


@dataclass(frozen=True)
class RoutingAgreement:
    """How often the draft's router picks the target's experts.

    Match of one (token, layer) = |draft experts ∩ target experts| / k.

    Attributes:
        mean: over every (token, layer).
        per_layer: mean over tokens, one value per layer.
        per_token: mean over layers, one value per token.
        exact_rate: share of (token, layer) whose sets are equal.
    """

    mean: float
    per_layer: list[float]
    per_token: list[float]
    exact_rate: float

    def as_dict(self) -> dict[str, object]:
        """Plain-Python view, for JSON."""
        return asdict(self)


def routing_agreement(draft: torch.Tensor, target: torch.Tensor) -> RoutingAgreement:
    """Draft/target routing agreement on the same tokens (teacher-forced).

    Args:
        draft: ``[T, L, k]`` the draft's choices.
        target: ``[T, L, k]`` the target's choices on the same positions.

    Raises:
        ValueError: shapes differ.

    Example:
        >>> t = torch.tensor([[[0, 1]], [[2, 3]]])
        >>> d = torch.tensor([[[1, 0]], [[2, 5]]])
        >>> routing_agreement(d, t).per_token
        [1.0, 0.5]
    """
    draft = check_routing(draft, "draft routing")
    target = check_routing(target, "target routing")
    if draft.shape != target.shape:
        raise ValueError(
            f"draft routing {tuple(draft.shape)} and target routing {tuple(target.shape)} "
            "must cover the same tokens and layers with the same top-k."
        )
    k = target.shape[2]
    # [T, L, k, k] equality, any over the draft's k: the target expert was also drafted.
    shared = (target.unsqueeze(-1) == draft.unsqueeze(-2)).any(-1).sum(-1).double()  # [T, L]
    match = shared / k
    return RoutingAgreement(
        mean=float(match.mean()),
        per_layer=[float(v) for v in match.mean(0)],
        per_token=[float(v) for v in match.mean(1)],
        exact_rate=float((shared == k).double().mean()),
    )


def routing_trace(routing: torch.Tensor, window: int = 1) -> list[list[frozenset[int]]]:
    """``trace[layer][step]``: experts needed by each step of ``window`` tokens
    (specter-cache's ``windowed_trace`` of a checked routing).

    ``window=1`` is token-by-token decoding; ``window=K+1`` approximates verifying K
    proposals at once (a trailing partial window is kept).

    Raises:
        ValueError: ``window`` < 1.
    """
    return windowed_trace(check_routing(routing), window)


def draft_plans(
    draft: torch.Tensor, window: int = 1, top_m: int | Sequence[int] | None = None
) -> list[list[list[int]]]:
    """``plans[layer][step]``: the draft's experts of each step, most chosen first.

    This is what draft-guided prefetch knows before a step: the draft's routing over the
    same tokens. Ties rank the lower id first.

    Args:
        draft: ``[T, L, k]`` draft routing.
        window: tokens per step (as in :func:`routing_trace`).
        top_m: keep at most this many experts per plan (one value or one per layer).

    Raises:
        ValueError: bad ``window`` or ``top_m``.
    """
    draft = check_routing(draft, "draft routing")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be an int >= 1, got {window!r}.")
    T, L, _ = draft.shape
    if top_m is None:
        limits = [None] * L
    elif isinstance(top_m, int):
        limits = [top_m] * L
    else:
        limits = list(top_m)
    if len(limits) != L or any(m is not None and m < 1 for m in limits):
        raise ValueError(f"top_m must be a positive int or {L} of them, got {top_m!r}.")
    per_layer = draft.permute(1, 0, 2).tolist()
    plans: list[list[list[int]]] = []
    for layer in range(L):
        steps = []
        for s in range(0, T, window):
            counts: dict[int, int] = {}
            for row in per_layer[layer][s : s + window]:
                for e in row:
                    counts[e] = counts.get(e, 0) + 1
            ranked = sorted(counts, key=lambda e: (-counts[e], e))
            steps.append(ranked[: limits[layer]] if limits[layer] is not None else ranked)
        plans.append(steps)
    return plans
