"""The observer protocol through which the controller announces speculation phases."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["SpeculationObserver", "check_observer"]

_METHODS = ("on_draft_start", "on_draft_token", "on_verify_start", "on_verify_end")


@runtime_checkable
class SpeculationObserver(Protocol):
    """Receives the phases of every speculative iteration, in this order.

    ``on_draft_start(K)``, then ``on_draft_token(0) .. on_draft_token(K-1)``,
    then ``on_verify_start(K + 1)``, then ``on_verify_end(a)``, with ``a`` the
    accepted count of :mod:`specter_spec.acceptance`. Iterations with ``K = 0``
    (plain decoding) announce ``on_draft_start(0)`` and no draft token. KV is
    rolled back after ``on_verify_end``. specter-cache implements this protocol
    to prefetch experts while the draft runs; specter-spec only calls it (duck
    typing: any object with these four methods works).

    Optionally, ``plain_steps_may_overlap() -> bool``: asked when decoding starts. True lets
    a controller queue a plain (K = 0) step before the previous plain step's
    ``on_verify_end``, so two plain windows overlap: ``on_draft_start(0)``,
    ``on_verify_start(1)`` of step ``i + 1`` come before ``on_verify_end(0)`` of step ``i``
    (each window still closes, in order). An observer that tracks per-window state across a
    plain step (an expert cache still loading experts) returns False or leaves the method
    out, and every iteration keeps the order above.
    """

    def on_draft_start(self, depth: int) -> None:
        """The draft is about to propose ``depth`` tokens."""
        ...

    def on_draft_token(self, index: int) -> None:
        """Draft proposal ``index`` (0-based) has been produced."""
        ...

    def on_verify_start(self, num_tokens: int) -> None:
        """The target is about to verify ``num_tokens`` rows (K + 1).

        The rows are the last committed token followed by the K proposals.
        """
        ...

    def on_verify_end(self, num_accepted: int) -> None:
        """Verification finished; ``num_accepted`` proposals were accepted (0..K)."""
        ...


def check_observer(observer: object) -> None:
    """Raise a clear ``TypeError`` if ``observer`` lacks a method of :class:`SpeculationObserver`.

    Raises:
        TypeError: naming the missing methods.
    """
    missing = [name for name in _METHODS if not callable(getattr(observer, name, None))]
    if missing:
        raise TypeError(
            f"cache {type(observer).__name__} does not implement the SpeculationObserver "
            f"protocol: missing {', '.join(missing)}. Pass cache=None to run without one."
        )
