"""Acceptance decided by a recorded greedy run instead of the models' own tokens.

A routing replay (specter-models' ``routing_replay``) makes a model compute the experts a
recorded run routed to; the models' own tokens are then meaningless (random weights), so
the number of accepted proposals must come from the recording too. A recording of one
sequence holds its tokens ``s[0..N)`` (a prompt and the target's greedy continuation) and,
per position ``p``, whether the draft's greedy next token after ``s[0..p]`` equals the
target's (both teacher-forced on ``s``). With greedy decoding that decides acceptance
exactly: after ``n`` committed tokens, proposal ``j`` (1-based) of an iteration is accepted
iff positions ``n - 1 .. n - 2 + j`` all agree, and the correction or bonus token is
``s[n + a]``.

:class:`AcceptanceOverride` is the controller's hook
(``SpecController(acceptance=...)``); :class:`RecordedAcceptance` implements it from
device tensors, with no host synchronisation.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from specter_spec.acceptance import AcceptanceResult

__all__ = ["AcceptanceOverride", "RecordedAcceptance", "check_acceptance_override"]


@runtime_checkable
class AcceptanceOverride(Protocol):
    """Decides each iteration's outcome in place of the acceptance rule.

    ``decide(position, proposals)`` is called after the target verified ``proposals``
    (``[K]`` int64 on the target's device, ``K >= 0``) whose first sits at absolute
    position ``position`` (the committed length ``n``). It returns the ``[K]`` tokens the
    controller commits in the proposals' place (their accepted prefix is committed) and
    the outcome (accepted count and correction or bonus token, device tensors).
    """

    def decide(
        self, position: int, proposals: torch.Tensor
    ) -> tuple[torch.Tensor, AcceptanceResult]: ...


def check_acceptance_override(override: object) -> None:
    """Raise a clear ``TypeError`` when ``override`` has no callable ``decide``."""
    if not callable(getattr(override, "decide", None)):
        raise TypeError(
            f"acceptance must implement AcceptanceOverride (a decide(position, proposals) "
            f"method), got {type(override).__name__}; pass None for the acceptance rule."
        )


class RecordedAcceptance:
    """The outcomes of one recorded greedy sequence (see the module docstring).

    Args:
        tokens: ``[N]`` int64: the sequence, prompt first.
        agree: ``[N]`` bool on the same device: whether the draft's greedy next token
            after position ``p`` equals the target's.

    Raises:
        ValueError: shapes or devices that do not match, or a non-bool ``agree``.
    """

    def __init__(self, tokens: torch.Tensor, agree: torch.Tensor) -> None:
        if tokens.dim() != 1 or agree.shape != tokens.shape:
            raise ValueError(
                f"a recorded sequence needs tokens [N] and agreement flags [N]; got "
                f"{tuple(tokens.shape)} and {tuple(agree.shape)}."
            )
        if agree.dtype != torch.bool or tokens.dtype.is_floating_point:
            raise ValueError(
                f"tokens must be integer ids and agree bool; got {tokens.dtype} and {agree.dtype}."
            )
        if tokens.device != agree.device:
            raise ValueError(f"tokens on {tokens.device} but agree on {agree.device}.")
        self.tokens = tokens.long()
        self.agree = agree
        self.length = int(tokens.shape[0])

    def decide(
        self, position: int, proposals: torch.Tensor
    ) -> tuple[torch.Tensor, AcceptanceResult]:
        """The recorded tokens ``s[n .. n + K)`` and the recorded outcome at ``n = position``.

        Raises:
            ValueError: the recording ends before position ``n + K`` (the correction or
                bonus token), or ``n < 1``.
        """
        depth = int(proposals.shape[0])
        n = position
        if n < 1 or n + depth >= self.length:
            raise ValueError(
                f"the recorded sequence holds {self.length} tokens; an iteration at committed "
                f"length {n} with {depth} proposals needs tokens up to position {n + depth}. "
                "Record a longer continuation or generate fewer tokens."
            )
        flags = self.agree[n - 1 : n - 1 + depth].long()
        accepted = torch.cumprod(flags, dim=0).sum()  # the leading run of agreement
        window = self.tokens[n : n + depth + 1]
        next_token = window.gather(0, accepted.view(1)).squeeze(0)
        return window[:depth], AcceptanceResult(num_accepted=accepted, next_token=next_token)
