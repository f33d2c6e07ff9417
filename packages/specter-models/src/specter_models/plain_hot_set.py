"""A pinned hot set for plain decoding (no INT4 draft): whether pinning pays among the same
slots, and which experts.

Without a draft a pinned expert frees no memory (there is no INT4 copy to drop): every
candidate count ``h`` has the slots of the budget's draftless plan. What pinning changes
is replacement: the ``h`` most routed experts are never evicted, and LRU runs over the
other ``slots - h``. That helps where a stable core of often-routed experts would
otherwise be pushed out by bursts of rarely-routed ones (LRU keeps whatever came last),
and costs where the routing moves on (the pinned slots stop following it). Which of the
two a routing does is measured, as :func:`specter_models.choose_hot_experts` measures it
for the draft: the calibration routing is replayed token by token through LRU with each
candidate pinned, every fold's hot set counted on the other folds. Unlike the draft's
choice, every candidate starts warm: the slots first hold the other folds' ``slots`` most
routed experts (the pinned ones among them), whose loads are not counted, so ``h = 0``
is not charged the cold start a pinned set skips.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PretrainedConfig

from specter_cache import simulate_policy
from specter_cache.trace_simulation import windowed_trace
from specter_models.hot_experts import (
    HotExpertChoice,
    _folds,
    _other_folds,
    hottest_experts,
    routing_counts,
)
from specter_models.memory_plan import DEFAULT_MAX_SEQ_LEN, plan_memory

__all__ = ["choose_plain_hot_experts"]


def choose_plain_hot_experts(
    config: PretrainedConfig,
    gpu_memory_gb: float | None,
    calibration_routes: Sequence[torch.Tensor],
    *,
    candidates: Sequence[int] | None = None,
    dtype: torch.dtype = torch.float16,
    max_seq_len: int = DEFAULT_MAX_SEQ_LEN,
    staging_slots: int = 0,
) -> HotExpertChoice:
    """Pick ``h`` and the hot sets of a draftless load (``load_model(draft=None,
    hot_experts=)``) at a budget.

    Args:
        config: the model's transformers config.
        gpu_memory_gb: the budget (None: every expert resident, nothing pinned).
        calibration_routes: ``[T, L, k]`` target routings of calibration text.
        candidates: the ``h`` to try (default: 0 and every ``E // 16``-th count); those
            that leave no evictable slot are skipped.
        dtype, max_seq_len, staging_slots: as ``plan_memory`` (``with_draft=False``).

    Returns:
        A ``HotExpertChoice`` with ``window`` 1 and no pruned experts; ``per_layer`` 0 where
        pinning moves no fewer experts than LRU over every slot (ties go to the smaller
        ``h``), and ``loads`` the replayed loads per candidate.

    Raises:
        ValueError: no calibration routing, or one of fewer than two tokens alone.
        MemoryBudgetError: the budget cannot hold the model without the draft.
    """
    if not calibration_routes:
        raise ValueError(
            "choose_plain_hot_experts needs at least one calibration routing [T, L, k]"
        )
    plan = plan_memory(
        config, gpu_memory_gb, dtype=dtype, max_seq_len=max_seq_len, with_draft=False,
        staging_slots=staging_slots,
    )  # fmt: skip
    slots, E, L = plan.slots_per_layer, plan.num_experts, plan.num_moe_layers
    if gpu_memory_gb is None or slots >= E:
        return HotExpertChoice(0, [[] for _ in range(L)], slots, {}, 1)
    folds = _folds(calibration_routes)
    counts = [routing_counts([f], E) for f in folds]
    if candidates is None:
        candidates = range(0, E, max(1, E // 16))
    loads: dict[int, int] = {}
    for h in sorted({c for c in candidates if 0 <= c < slots}):
        total = 0
        for i, fold in enumerate(folds):
            others = _other_folds(counts, i)
            # Warm start: the slots hold the other folds' most routed experts, the pinned
            # ones (the first h of them) included; those loads are set-up, not counted.
            warm = hottest_experts(others, slots)
            trace = windowed_trace(fold.to("cpu", torch.long), 1)
            steps = [[frozenset(w), *s] for w, s in zip(warm, trace, strict=True)]
            hot = hottest_experts(others, h) if h else None
            replay = simulate_policy(steps, "lru", slots, num_experts=E, pinned=hot)
            total += replay.loads - (slots - h) * L
        loads[h] = total
    best = min(loads, key=lambda h: (loads[h], h))
    hot_sets = hottest_experts(sum(counts), best) if best else [[] for _ in range(L)]
    return HotExpertChoice(best, hot_sets, slots, loads, 1)
