"""What a pinned hot-set draft would hold at a budget: the replay's ``pinned`` configuration.

The INT4 draft's experts take part of the budget (at 24 GB on DeepSeek-V2-Lite, 16 of the 46
FP16 slots per layer plain decoding gets). A draft that computed its most routed experts from
FP16 copies pinned in the cache would keep no INT4 copy of them, and the memory that frees
buys more FP16 slots. This module sizes that configuration from a memory plan and picks each
prompt's pinned experts from the *other* prompts' routing (a calibration on different text,
not the replayed tokens themselves), so the policy replay can put its hit rate beside LRU's.
It estimates; the pinned draft itself is not built.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["PinnedConfiguration", "pinned_configuration"]


@dataclass(frozen=True)
class PinnedConfiguration:
    """A pinned hot-set configuration of the expert cache at one budget.

    Attributes:
        experts_per_layer: pinned experts per layer ``h`` (one fewer than the draft plan's
            slots, so the slots the INT4 copies free are all LRU slots).
        slots_per_layer: FP16 slots per layer: the plan's plus what ``h`` INT4 copies free.
        hot_sets: ``hot_sets[prompt][layer]`` = the pinned experts for that prompt.
    """

    experts_per_layer: int
    slots_per_layer: int
    hot_sets: list[list[list[int]]]


def pinned_configuration(
    plan: Any, target_routes: Sequence[torch.Tensor]
) -> PinnedConfiguration | None:
    """The pinned configuration of ``plan``'s budget, or None where it does not apply.

    Args:
        plan: a ``specter_models.MemoryPlan`` with a draft (``slots_per_layer``,
            ``num_experts``, ``num_moe_layers``, ``expert_bytes``, ``draft_int4_bytes``).
        target_routes: per prompt, ``[T, L, k]`` target routing.

    Returns:
        None with fewer than two prompts (no other prompt to count on), fewer than two
        slots, no INT4 draft, or every expert resident already.
    """
    S, E, L = plan.slots_per_layer, plan.num_experts, plan.num_moe_layers
    if len(target_routes) < 2 or S < 2 or S >= E or plan.draft_int4_bytes <= 0:
        return None
    h = S - 1
    int4_per_expert = plan.draft_int4_bytes / (L * E)
    slots = min(E, S + int(h * int4_per_expert // plan.expert_bytes))
    counts = [_layer_counts(routes, L, E) for routes in target_routes]
    hot_sets = []
    for i in range(len(target_routes)):
        others = sum(c for j, c in enumerate(counts) if j != i)
        # Most routed first; ties by expert id (stable sort of -count).
        order = torch.sort(-others, dim=1, stable=True).indices[:, :h]
        hot_sets.append([sorted(row.tolist()) for row in order])
    return PinnedConfiguration(experts_per_layer=h, slots_per_layer=slots, hot_sets=hot_sets)


def _layer_counts(routes: torch.Tensor, num_layers: int, num_experts: int) -> torch.Tensor:
    """``[L, E]`` how often each expert was routed to, per layer."""
    if routes.dim() != 3 or routes.shape[1] != num_layers:
        raise ValueError(f"routing must be [T, L={num_layers}, k], got {tuple(routes.shape)}")
    per_layer = routes.permute(1, 0, 2).reshape(num_layers, -1).long()
    return torch.stack([torch.bincount(row, minlength=num_experts) for row in per_layer])
