"""Plain (K = 0) target steps queued ahead of reading their tokens back.

A plain decoding step needs its predecessor's token only as a device tensor: the forward
reads it from the committed buffer, and greedy or sampled acceptance writes the next one
there. The host needs the token only to stream it, to stop at a stop token and to count.
So the controller queues step ``i + 1`` before it reads step ``i``'s token back, and the
device never waits for the host between plain steps (the host's work for one step runs
while the device computes the next).

:class:`TokenReadback` is the host side of that: a small ring of (pinned, on CUDA) host
slots, each filled by an asynchronous device-to-host copy and a CUDA event recorded after
it, so reading a token waits for that step alone, not for the work queued after it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

__all__ = ["PIPELINE_DEPTH", "PlainQueue", "QueuedPlainStep", "TokenReadback"]

PIPELINE_DEPTH = 2
"""Plain steps in flight at most: one being read back, one queued behind it."""


@dataclass
class QueuedPlainStep:
    """A plain step queued on the device whose token the host has not read yet.

    Attributes:
        position: index of its token in the committed buffer.
        slot: the :class:`TokenReadback` slot its token is copied to.
        ready: recorded after that copy (None off CUDA, where the copy is synchronous).
        queued_at: host clock reading when the controller started queueing it.
    """

    position: int
    slot: int
    ready: torch.cuda.Event | None
    queued_at: float


class TokenReadback:
    """Host slots for tokens of queued steps, filled without synchronising the device.

    Args:
        device: where the tokens are produced.
        slots: ring size; must exceed the steps in flight (default: ``PIPELINE_DEPTH + 1``).
    """

    def __init__(self, device: torch.device, slots: int = PIPELINE_DEPTH + 1) -> None:
        self._cuda = device.type == "cuda"
        self._host = torch.empty(slots, dtype=torch.long, pin_memory=self._cuda)
        # One event per slot, re-recorded at each push: a slot comes round again only after
        # the step that used it was read (the ring exceeds the steps in flight).
        self._events = [torch.cuda.Event() for _ in range(slots)] if self._cuda else None
        self._next = 0

    def push(self, token: torch.Tensor) -> tuple[int, torch.cuda.Event | None]:
        """Queue a copy of the one-element device tensor ``token`` to the next slot.

        Returns:
            ``(slot, ready)``: the slot, and an event recorded after the copy (None off CUDA).
        """
        slot = self._next
        self._next = (slot + 1) % self._host.numel()
        self._host[slot : slot + 1].copy_(token.reshape(1), non_blocking=self._cuda)
        if self._events is None:
            return slot, None
        ready = self._events[slot]
        ready.record()
        return slot, ready

    def read(self, step: QueuedPlainStep) -> int:
        """The step's token, after waiting for its copy (and only the work queued before it)."""
        if step.ready is not None:
            step.ready.synchronize()
        return int(self._host[step.slot])


@dataclass
class PlainQueue:
    """One generation's queued plain steps (see ``pipeline_plain``).

    Attributes:
        readback: host slots their tokens are copied to (None: plain steps are not queued).
        host_clock: a clock that does not wait for the device (``time.perf_counter`` in
            place of a :class:`PhaseClock`).
        stop: the generation's stop tokens.
        steps: the queued steps, oldest first.
        last_read: when the last token was read back (None before a run's first read, or
            after a speculative iteration).
    """

    readback: TokenReadback | None
    host_clock: Callable[[], float]
    stop: frozenset[int]
    steps: deque[QueuedPlainStep] = field(default_factory=deque)
    last_read: float | None = None
