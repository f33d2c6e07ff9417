"""A pinned hot set of experts: which experts to keep in FP16 for good, and how many.

Under a budget the INT4 draft's experts take memory that would otherwise hold FP16 slots
(on DeepSeek-V2-Lite at 24 GB, 16 of the 46 slots per layer plain decoding gets). Pinning a
layer's ``h`` most routed experts in FP16 slots lets the draft compute them from those slots
(exactly as the target does) and drop their INT4 copies; each dropped copy buys
``int4 / fp16`` (about a quarter) of a slot more. The cost: the pinned slots no longer
follow the routing, so the other experts share fewer evictable slots. Where that trade pays
depends on how concentrated the routing is, so ``choose_hot_experts`` measures it: it
replays a calibration routing through specter-cache with each candidate ``h`` (the memory
plan gives each its slots), choosing every fold's hot set on the *other* folds' routing so
that a hot set is never scored on the tokens it was picked from, and keeps the ``h`` with
the fewest expert loads.

Example:
    >>> routes = [torch.randint(0, 8, (32, 2, 2)) for _ in range(2)]  # [T, L, k] per prompt
    >>> hottest_experts(routing_counts(routes, num_experts=8), 3)[0]  # doctest: +SKIP
    [1, 4, 6]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import PretrainedConfig

from specter_cache import simulate_policy
from specter_cache.trace_simulation import windowed_trace
from specter_models.memory_plan import (
    DEFAULT_MAX_SEQ_LEN,
    DEFAULT_MAX_VERIFY_ROWS,
    MemoryBudgetError,
    plan_memory,
)

__all__ = [
    "AUTO_PRUNED_FRACTION",
    "HotExpertChoice",
    "PlainReplay",
    "auto_pruned_per_layer",
    "choose_hot_experts",
    "coldest_experts",
    "hottest_experts",
    "replay_plain_decoding",
    "resolve_pruned_per_layer",
    "routing_counts",
]


def routing_counts(routes: Sequence[torch.Tensor], num_experts: int) -> torch.Tensor:
    """``[L, E]`` int64: how often each expert of each MoE layer was routed to.

    Args:
        routes: ``[T, L, k]`` routings (expert ids), e.g. one per calibration prompt.
        num_experts: ``E``.

    Raises:
        ValueError: no routing, routings of different layer counts, or ids outside ``[0, E)``.
    """
    if not routes:
        raise ValueError("routing_counts needs at least one [T, L, k] routing")
    layers = {int(r.shape[1]) if r.dim() == 3 else -1 for r in routes}
    if len(layers) != 1 or -1 in layers:
        raise ValueError(
            f"routings must all be [T, L, k] with one L, got {[tuple(r.shape) for r in routes]}"
        )
    (L,) = layers
    counts = torch.zeros(L, num_experts, dtype=torch.long)
    for routing in routes:
        ids = routing.detach().to("cpu", torch.long)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= num_experts):
            raise ValueError(f"routing holds expert ids outside [0, {num_experts})")
        per_layer = ids.permute(1, 0, 2).reshape(L, -1)
        counts.scatter_add_(1, per_layer, torch.ones_like(per_layer))
    return counts


def hottest_experts(counts: torch.Tensor, per_layer: int) -> list[list[int]]:
    """The ``per_layer`` most routed experts of each layer, sorted by id.

    Args:
        counts: ``[L, E]`` routing counts.
        per_layer: ``h``, in ``[0, E)``.

    Ties go to the lower id.

    Raises:
        ValueError: ``per_layer`` outside ``[0, E)``.
    """
    E = counts.shape[1]
    if isinstance(per_layer, bool) or not isinstance(per_layer, int) or not 0 <= per_layer < E:
        raise ValueError(f"per_layer must be an int in [0, {E}), got {per_layer!r}")
    order = torch.sort(-counts, dim=1, stable=True).indices[:, :per_layer]
    return [sorted(row.tolist()) for row in order]


def coldest_experts(counts: torch.Tensor, per_layer: int) -> list[list[int]]:
    """The ``per_layer`` least routed experts of each layer, sorted by id: a pruned draft's
    experts (``load_model(draft_pruned_experts=)``).

    Ties go to the higher id, so that with ``h + p <= E`` the ``p`` coldest never meet
    :func:`hottest_experts`' ``h`` (whose ties go to the lower id).

    Raises:
        ValueError: ``per_layer`` outside ``[0, E)``.
    """
    E = counts.shape[1]
    if isinstance(per_layer, bool) or not isinstance(per_layer, int) or not 0 <= per_layer < E:
        raise ValueError(f"per_layer must be an int in [0, {E}), got {per_layer!r}")
    order = torch.sort(-counts, dim=1, stable=True).indices
    return [sorted(row.tolist()) for row in order[:, E - per_layer :]]


AUTO_PRUNED_FRACTION = 3
"""``pruned_per_layer="auto"`` prunes ``E // 3`` experts per layer under a budget that leaves
some expert without a slot. On DeepSeek-V2-Lite at 24 GB (random weights, H200, 3 HumanEval
prompts x 64 tokens, one process an arm): pruning 0 / 14 / 21 of 64 took ``specter`` 8.72 /
7.30 / 6.59 ms a token (39 / 45 / 46 slots, acceptance 0.97 / 0.86 / 0.79)."""


def auto_pruned_per_layer(num_experts: int, slots_per_layer: int) -> int:
    """The ``"auto"`` pruned count: ``E // 3`` when ``slots_per_layer < E`` (a budget that
    cannot hold every expert, where the INT4 memory buys slots), else 0."""
    return num_experts // AUTO_PRUNED_FRACTION if slots_per_layer < num_experts else 0


def resolve_pruned_per_layer(
    config: PretrainedConfig,
    gpu_memory_gb: float | None,
    pruned_per_layer: int | str,
    hot_experts_per_layer: int = 0,
    **plan_args: object,
) -> int:
    """``pruned_per_layer`` as a count: an int as given; ``"auto"`` as
    :func:`auto_pruned_per_layer` of the unpruned, unpinned plan at ``gpu_memory_gb``
    (``E // 3`` where it leaves some expert slotless or the whole INT4 draft does not fit,
    else 0), at most ``E - hot_experts_per_layer - 1`` so that one INT4 expert stays beside
    the pinned ones. ``plan_args`` go to ``plan_memory`` (dtype, max_seq_len, ...).

    Raises:
        ValueError: a string other than ``"auto"``.
    """
    if pruned_per_layer != "auto":
        if isinstance(pruned_per_layer, str):
            raise ValueError(
                f"pruned_per_layer must be an int >= 0 or 'auto', got {pruned_per_layer!r}"
            )
        return pruned_per_layer
    try:
        unpruned = plan_memory(config, gpu_memory_gb, **plan_args)  # type: ignore[arg-type]
        E, slots = unpruned.num_experts, unpruned.slots_per_layer
    except MemoryBudgetError:  # the whole draft does not fit: a pruned one may
        dtype = plan_args.get("dtype", torch.float16)
        E = plan_memory(config, slots_per_layer=1, dtype=dtype).num_experts  # type: ignore[arg-type]
        slots = 0
    return min(auto_pruned_per_layer(E, slots), max(0, E - hot_experts_per_layer - 1))


@dataclass(frozen=True)
class HotExpertChoice:
    """A hot set chosen for one budget.

    Attributes:
        per_layer: pinned experts per layer ``h`` (0: pinning does not pay here).
        hot_experts: ``hot_experts[layer]`` for ``load_model(hot_experts=)`` (empty lists when 0),
            chosen on the whole calibration routing.
        slots_per_layer: the FP16 slots per layer the budget gives with ``h`` pinned.
        loads: candidate ``h`` -> expert loads of the cross-validated replay (the choice
            has the fewest; a candidate the budget cannot hold is absent; empty when every
            expert is resident and nothing was replayed).
        window: tokens per replayed step.
        pruned_experts: ``pruned_experts[layer]`` for ``load_model(draft_pruned_experts=)``: the
            ``pruned_per_layer`` least routed experts of the whole calibration routing
            (empty lists when none), which every candidate's plan counted.
    """

    per_layer: int
    hot_experts: list[list[int]]
    slots_per_layer: int
    loads: dict[int, int] = field(default_factory=dict)
    window: int = 1
    pruned_experts: list[list[int]] = field(default_factory=list)

    @property
    def pruned_per_layer(self) -> int:
        """Experts per layer the draft skips (0: none)."""
        return len(self.pruned_experts[0]) if self.pruned_experts else 0

    def describe(self) -> str:
        """``"h experts per layer pinned, [p pruned from the draft, ]s slots per layer"``."""
        pruned = f"{self.pruned_per_layer} pruned from the draft, " if self.pruned_per_layer else ""
        return (
            f"{self.per_layer} experts per layer pinned, {pruned}{self.slots_per_layer} slots "
            "per layer"
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "per_layer": self.per_layer,
            "slots_per_layer": self.slots_per_layer,
            "loads": {str(h): n for h, n in self.loads.items()},
            "window": self.window,
            "hot_experts": self.hot_experts,
            "pruned_per_layer": self.pruned_per_layer,
            "pruned_experts": self.pruned_experts,
        }


def choose_hot_experts(
    config: PretrainedConfig,
    gpu_memory_gb: float | None,
    calibration_routes: Sequence[torch.Tensor],
    *,
    window: int = 5,
    candidates: Sequence[int] | None = None,
    dtype: torch.dtype = torch.float16,
    max_seq_len: int = DEFAULT_MAX_SEQ_LEN,
    max_verify_rows: int = DEFAULT_MAX_VERIFY_ROWS,
    draft_group_size: int | None = None,
    pruned_per_layer: int | str = 0,
    max_batch: int = 1,
) -> HotExpertChoice:
    """Pick ``h`` and the hot sets for ``load_model(..., hot_experts=)`` at a budget.

    Each candidate ``h`` gets its memory plan (``plan_memory(hot_experts_per_layer=h)``);
    the calibration routing, in steps of ``window`` tokens (a verification of ``window - 1``
    proposals), is replayed through an LRU ``ExpertCache`` with that plan's slots and the
    hot set pinned. Fold ``i`` (calibration routing ``i``; a single routing is split into
    halves) is replayed with the hot set counted on the other folds. The ``h`` with the
    fewest loads wins (ties: the smaller ``h``), and its hot set is then counted on every
    fold.

    Args:
        config: the model's transformers config.
        gpu_memory_gb: the budget (None: no budget; every expert is resident and nothing is
            pinned).
        calibration_routes: ``[T, L, k]`` target routings of calibration text (not the text
            that will be measured).
        window: tokens per replayed step.
        candidates: the ``h`` to try (default: 0 and every ``E // 16``-th count, all counts
            for ``E < 32``; those the budget cannot hold are skipped).
        dtype, max_seq_len, max_verify_rows, draft_group_size, max_batch: as
            ``plan_memory``.
        pruned_per_layer: ``p``, experts per layer the draft skips (a pruned draft): each
            plan holds ``E - h - p`` INT4 experts, candidates with ``h + p >= E`` are
            skipped, and the choice names the ``p`` least routed experts of the whole
            calibration routing (``coldest_experts``). The replay counts loads only (the
            draft's acceptance, which pruning lowers, is not modelled). ``"auto"``:
            :func:`auto_pruned_per_layer` (``E // 3`` under a budget that leaves some expert
            without a slot, else 0).

    Raises:
        ValueError: no calibration routing, one of fewer than two tokens alone, or a
            ``pruned_per_layer`` outside ``[0, E)``.
        MemoryBudgetError: the budget cannot hold the model even without pinning, or none
            of ``candidates`` fits it.
    """
    if not calibration_routes:
        raise ValueError("choose_hot_experts needs at least one calibration routing [T, L, k]")

    def plan(h: int):
        return plan_memory(
            config, gpu_memory_gb, dtype=dtype, max_seq_len=max_seq_len,
            max_verify_rows=max_verify_rows, draft_group_size=draft_group_size,
            hot_experts_per_layer=h, pruned_experts_per_layer=pruned_per_layer,
            max_batch=max_batch,
        )  # fmt: skip

    pruned_per_layer = resolve_pruned_per_layer(
        config, gpu_memory_gb, pruned_per_layer, dtype=dtype, max_seq_len=max_seq_len,
        max_verify_rows=max_verify_rows, draft_group_size=draft_group_size, max_batch=max_batch,
    )  # fmt: skip
    base = plan(0)
    E, L = base.num_experts, base.num_moe_layers
    pruned = (
        coldest_experts(routing_counts(calibration_routes, E), pruned_per_layer)
        if pruned_per_layer
        else []
    )
    if gpu_memory_gb is None or base.slots_per_layer >= E:
        return HotExpertChoice(0, [[] for _ in range(L)], base.slots_per_layer, {}, window, pruned)
    folds = _folds(calibration_routes)
    counts = [routing_counts([f], E) for f in folds]
    traces = [windowed_trace(f.to("cpu", torch.long), window) for f in folds]
    if candidates is None:
        candidates = range(0, E, max(1, E // 16))  # at most 16 replays per fold
    loads: dict[int, int] = {}
    slots_of: dict[int, int] = {}
    for h in sorted(set(candidates)):
        if h + pruned_per_layer >= E:
            continue  # no INT4 expert would be left
        try:
            slots = plan(h).slots_per_layer
        except (MemoryBudgetError, ValueError):
            continue  # this many pins do not fit (or are no valid count)
        total = 0
        for i, trace in enumerate(traces):
            hot = hottest_experts(_other_folds(counts, i), h) if h else None
            total += simulate_policy(trace, "lru", slots, num_experts=E, pinned=hot).loads
        loads[h], slots_of[h] = total, slots
    if not loads:
        raise MemoryBudgetError(
            f"none of the pinned counts {sorted(set(candidates))} fits gpu_memory_gb="
            f"{gpu_memory_gb} (each needs its hot experts plus one evictable slot per layer); "
            "give fewer pinned experts or a larger budget"
        )
    best = min(loads, key=lambda h: (loads[h], h))
    hot_sets = hottest_experts(sum(counts), best) if best else [[] for _ in range(L)]
    return HotExpertChoice(best, hot_sets, slots_of[best], loads, window, pruned)


@dataclass(frozen=True)
class PlainReplay:
    """Plain decoding's side of the draft's memory trade at one budget.

    Attributes:
        slots_per_layer: the FP16 slots per layer the budget gives without the INT4 draft.
        loads: expert loads of the calibration routing replayed token by token through an
            LRU cache of those slots (0 when they hold every expert), over the same folds as
            ``choose_hot_experts``, so the two counts compare; each fold starts with the
            slots holding the other folds' most routed experts (warm, as after a prefill,
            and as a hot set starts pinned), whose loads are not counted.
    """

    slots_per_layer: int
    loads: int

    def as_dict(self) -> dict[str, object]:
        return {"slots_per_layer": self.slots_per_layer, "loads": self.loads}


def replay_plain_decoding(
    config: PretrainedConfig,
    gpu_memory_gb: float,
    calibration_routes: Sequence[torch.Tensor],
    *,
    dtype: torch.dtype = torch.float16,
    max_seq_len: int = DEFAULT_MAX_SEQ_LEN,
    max_verify_rows: int = DEFAULT_MAX_VERIFY_ROWS,
    staging_slots: int = 0,
    max_batch: int = 1,
) -> PlainReplay:
    """Replay the calibration routing through plain decoding's cache at a budget.

    Without the INT4 draft a budget holds more FP16 slots; plain decoding steps one token
    at a time through them (LRU, nothing pinned). Set beside ``choose_hot_experts``' loads
    (the draft's slots, its hot set pinned, a verification's window per step), this says
    which of the two moves fewer experts on this routing.

    Args:
        config: the model's transformers config.
        gpu_memory_gb: the budget.
        calibration_routes: ``[T, L, k]`` routings, as for ``choose_hot_experts``.
        dtype, max_seq_len, max_verify_rows, staging_slots, max_batch: as ``plan_memory``.

    Raises:
        ValueError: no calibration routing, or one of fewer than two tokens alone.
        MemoryBudgetError: the budget cannot hold the model even without the draft.
    """
    if not calibration_routes:
        raise ValueError("replay_plain_decoding needs at least one calibration routing [T, L, k]")
    plan = plan_memory(
        config, gpu_memory_gb, dtype=dtype, max_seq_len=max_seq_len,
        max_verify_rows=max_verify_rows, with_draft=False, staging_slots=staging_slots,
        max_batch=max_batch,
    )  # fmt: skip
    slots, E = plan.slots_per_layer, plan.num_experts
    if slots >= E:
        return PlainReplay(slots, 0)
    folds = _folds(calibration_routes)
    counts = [routing_counts([f], E) for f in folds]
    loads = 0
    for i, fold in enumerate(folds):
        # Warm, as after a prefill (and as a hot set's pins start loaded): the slots first
        # hold the other folds' most routed experts; loading them is not counted.
        warm = hottest_experts(_other_folds(counts, i), slots)
        trace = windowed_trace(fold.to("cpu", torch.long), 1)
        first = [[frozenset(experts), *steps] for experts, steps in zip(warm, trace, strict=True)]
        loads += simulate_policy(first, "lru", slots, num_experts=E).loads - slots * len(warm)
    return PlainReplay(slots, loads)


def _other_folds(counts: Sequence[torch.Tensor], fold: int) -> torch.Tensor:
    """``[L, E]`` routing counts of every fold but ``fold``: what a fold is scored against."""
    return sum(c for j, c in enumerate(counts) if j != fold)


def _folds(routes: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The calibration routings as folds: as given, or one routing split in halves."""
    if len(routes) > 1:
        return list(routes)
    (only,) = routes
    if only.dim() != 3 or only.shape[0] < 2:
        raise ValueError(
            "a single calibration routing must be [T, L, k] with T >= 2 (it is split into "
            f"two folds), got {tuple(only.shape)}; give more calibration text"
        )
    half = only.shape[0] // 2
    return [only[:half], only[half:]]
