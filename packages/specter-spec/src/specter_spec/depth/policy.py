"""How the controller chooses the speculation depth K of each iteration."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from specter_spec.statistics import IterationStats

__all__ = ["DepthPolicy", "FixedDepth", "as_depth_policy", "check_depth"]


def check_depth(depth: object, source: str) -> int:
    """Return ``depth`` if it is an int >= 0, else raise naming ``source``.

    Raises:
        TypeError: if ``depth`` is not an int (bools are refused too).
        ValueError: if ``depth`` is negative.
    """
    if isinstance(depth, bool) or not isinstance(depth, int):
        raise TypeError(
            f"{source} must be an int >= 0 (0 = plain target decoding) or a depth policy "
            f"such as AdaptiveDepth, got {depth!r} of type {type(depth).__name__}."
        )
    if depth < 0:
        raise ValueError(
            f"{source} must be >= 0 (0 = plain target decoding), got {depth}. "
            "Use 0 to turn speculation off."
        )
    return depth


@runtime_checkable
class DepthPolicy(Protocol):
    """Chooses K before each iteration and learns from the iteration's statistics."""

    def choose_depth(self) -> int:
        """The depth K >= 0 for the next iteration."""
        ...

    def observe(self, iteration: IterationStats) -> None:
        """Record a finished iteration (its depth, accepted count and phase times)."""
        ...


class FixedDepth:
    """Always the same depth K.

    Args:
        depth: K >= 0; 0 is plain target decoding.

    Raises:
        TypeError, ValueError: if ``depth`` is not an int >= 0.
    """

    def __init__(self, depth: int) -> None:
        self.depth = check_depth(depth, "depth")

    def choose_depth(self) -> int:
        """Always ``depth``."""
        return self.depth

    def observe(self, iteration: IterationStats) -> None:
        """Nothing to learn."""

    def __repr__(self) -> str:
        return f"FixedDepth({self.depth})"


def as_depth_policy(depth: int | DepthPolicy) -> DepthPolicy:
    """An int becomes :class:`FixedDepth`; a policy object is returned as it is.

    Raises:
        TypeError: if ``depth`` is neither an int nor a policy.
        ValueError: if ``depth`` is a negative int.
    """
    if isinstance(depth, DepthPolicy) and not isinstance(depth, int):
        return depth
    return FixedDepth(check_depth(depth, "depth"))


def is_plain(policy: DepthPolicy) -> bool:
    """Whether ``policy`` never speculates (a fixed depth of 0)."""
    return isinstance(policy, FixedDepth) and policy.depth == 0


def controller_depth(draft: object | None, depth: int | DepthPolicy, plain: str) -> DepthPolicy:
    """A controller's depth policy from its ``depth`` argument, checked against its draft.

    Args:
        draft: the draft model, or None.
        depth: an int or a policy (see :func:`as_depth_policy`).
        plain: what ``depth=0`` does without a draft, for the error message.

    Raises:
        ValueError: no draft and a depth that would speculate.
    """
    policy = as_depth_policy(depth)
    if draft is None and not is_plain(policy):
        raise ValueError(
            f"draft is None but depth={depth!r}; speculation needs a draft model. "
            f"Pass a draft, or depth=0 for {plain}."
        )
    return policy
