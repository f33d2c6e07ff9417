"""``gpu_memory_gb="auto"``: the budget is the device memory free at start, less a margin."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from specter_models.memory_plan import GB, plan_memory

__all__ = ["AUTO_BUDGET_MARGIN_GB", "AutoBudget", "auto_budget"]

AUTO_BUDGET_MARGIN_GB = 1.5
"""GB of the free device memory an automatic budget leaves unplanned: headroom for the
allocator's fragmentation, library workspaces (cuBLAS, Triton) and the planned activation
buffers' estimate being low."""


@dataclass(frozen=True)
class AutoBudget:
    """What ``"auto"`` chose on this machine.

    Attributes:
        budget_gb: the budget in GB, or None: no budget (a CPU, or every expert fits).
        free_gb: free device memory at start (None on a CPU).
        reason: one line saying how the budget was chosen, for the log and ``specter info``.
    """

    budget_gb: float | None
    free_gb: float | None
    reason: str


def auto_budget(
    config: Any,
    device: str,
    *,
    margin_gb: float = AUTO_BUDGET_MARGIN_GB,
    **plan_args: Any,
) -> AutoBudget:
    """The budget ``"auto"`` means on ``device`` for the model of ``config``.

    On a CPU there is no device memory to budget: no budget. On CUDA the budget is
    ``torch.cuda.mem_get_info``'s free bytes less ``margin_gb``; where that holds every
    expert (``plan_memory`` without a budget, with ``plan_args``: dtype, max_seq_len,
    staging_slots) there is no budget either, so the model decodes with every expert
    resident as it would without one.

    Raises:
        ValueError: less free memory than the margin.
    """
    if not device.startswith("cuda"):
        return AutoBudget(None, None, "auto: no GPU memory budget on the CPU")
    free, _total = torch.cuda.mem_get_info(torch.device(device))
    free_gb = free / GB
    budget_gb = round(free_gb - margin_gb, 2)
    if budget_gb <= 0:
        raise ValueError(
            f"gpu_memory_gb='auto': {device} has {free_gb:.2f} GB free, no more than the "
            f"{margin_gb} GB margin auto leaves; free some GPU memory or give a budget in GB."
        )
    full = plan_memory(config, None, **plan_args)
    if full.expected_peak_bytes <= budget_gb * GB:
        return AutoBudget(
            None,
            free_gb,
            f"auto: {free_gb:.2f} GB free on {device} less a {margin_gb} GB margin holds every "
            f"expert (expected peak {full.expected_peak_bytes / GB:.2f} GB): no budget",
        )
    return AutoBudget(
        budget_gb,
        free_gb,
        f"auto: {budget_gb:.2f} GB budget = {free_gb:.2f} GB free on {device} less a "
        f"{margin_gb} GB margin",
    )
