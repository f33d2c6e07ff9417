"""Memory plans with and without the INT4 draft, the error when neither fits, and the miss
path a plan decodes with."""

from __future__ import annotations

from typing import Any

from specter_models.memory_plan import MemoryBudgetError, MemoryPlan, plan_memory

__all__ = [
    "PLAIN_STREAM_FILLS",
    "DraftDoesNotFitError",
    "budget_plan",
    "engine_choices",
    "neither_fits",
    "plain_plan",
]


class DraftDoesNotFitError(MemoryBudgetError):
    """A budget holds the model without its INT4 draft but not with it.

    Attributes:
        plain: the plan of plain decoding (no draft) at that budget.
    """

    def __init__(self, message: str, plain: MemoryPlan, cause: MemoryBudgetError) -> None:
        super().__init__(
            message,
            budget_gb=cause.budget_gb,
            needed_gb=cause.needed_gb,
            breakdown=cause.breakdown,
            plain_needed_gb=None,
        )
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
        f"either: {plain_short}",
        budget_gb=getattr(too_small, "budget_gb", None),
        needed_gb=getattr(too_small, "needed_gb", None),
        breakdown=getattr(too_small, "breakdown", ""),
        plain_needed_gb=getattr(plain_short, "needed_gb", None),
    )


PLAIN_STREAM_FILLS = 8
"""Candidate slots per layer plain streamed decoding fills by default (the bench's
``specter-plain-fill``), whose cache changes only through fills."""


def engine_choices(
    miss_path: str, stream_fills: int | None, *, budgeted: bool, speculate: bool
) -> tuple[str, int]:
    """The miss path and fills, with ``"auto"`` and None resolved.

    ``"auto"`` streams under a budget and loads otherwise (with every expert resident there
    is nothing to miss). Streaming is the measured faster path under a budget: on
    DeepSeek-V2-Lite plain decoding streamed with fills against acquired, 12.2 against
    16.6 ms a token at 24 GB and 21.8 against 27.8 at 16 GB on one H200. Fills default to
    :data:`PLAIN_STREAM_FILLS` for plain streamed decoding, whose cache changes only
    through them, and to none when speculating, whose prefetches keep the free slots.

    Returns:
        ``(miss_path, stream_fills)``.
    """
    if miss_path == "auto":
        miss_path = "stream" if budgeted else "load"
    if stream_fills is None:
        stream_fills = PLAIN_STREAM_FILLS if miss_path == "stream" and not speculate else 0
    return miss_path, stream_fills
