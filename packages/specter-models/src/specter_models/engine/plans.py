"""Memory plans with and without the INT4 draft, and the error when neither fits."""

from __future__ import annotations

from typing import Any

from specter_models.memory_plan import MemoryBudgetError, MemoryPlan, plan_memory

__all__ = ["DraftDoesNotFitError", "budget_plan", "neither_fits", "plain_plan"]


class DraftDoesNotFitError(MemoryBudgetError):
    """A budget holds the model without its INT4 draft but not with it.

    Attributes:
        plain: the plan of plain decoding (no draft) at that budget.
    """

    def __init__(self, message: str, plain: MemoryPlan) -> None:
        super().__init__(message)
        self.plain = plain


def budget_plan(
    config: Any, budget_gb: float | None, *, with_draft: bool, **plan_args: Any
) -> tuple[MemoryPlan | None, MemoryBudgetError | None]:
    """``plan_memory`` at ``budget_gb``, with or without the INT4 draft.

    Returns:
        ``(plan, None)``; ``(None, shortfall)`` when it does not fit (the
        ``MemoryBudgetError``); ``(None, None)`` without a budget. ``plan_args`` go to
        ``plan_memory`` (dtype, max_seq_len, staging_slots).
    """
    if budget_gb is None:
        return None, None
    try:
        return plan_memory(config, budget_gb, with_draft=with_draft, **plan_args), None
    except MemoryBudgetError as exc:
        return None, exc


def plain_plan(
    config: Any, budget_gb: float | None, **plan_args: Any
) -> tuple[MemoryPlan | None, MemoryBudgetError | None]:
    """:func:`budget_plan` of the target alone (no INT4 draft: plain decoding)."""
    return budget_plan(config, budget_gb, with_draft=False, **plan_args)


def neither_fits(too_small: Exception, plain_short: Exception | None) -> Exception:
    """The error for a budget that holds the model neither with its INT4 draft nor without:
    ``too_small`` (the speculative plan's shortfall) followed by ``plain_short``, what plain
    decoding (depth 0) would need (:func:`plain_plan`'s second value)."""
    if plain_short is None:
        return too_small
    return MemoryBudgetError(
        f"{too_small} Without the INT4 draft (--depth 0, plain decoding) it does not fit "
        f"either: {plain_short}"
    )
