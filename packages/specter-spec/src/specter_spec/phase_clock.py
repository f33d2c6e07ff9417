"""A wall clock for timing speculation phases on CPU or CUDA."""

from __future__ import annotations

import time

import torch

__all__ = ["PhaseClock"]


class PhaseClock:
    """Returns ``time.perf_counter()`` after the compute stream's queued work has finished.

    CUDA kernels run asynchronously, so reading the host clock alone would time
    the launches, not the work. On a CUDA device each reading synchronises the
    device's current stream once; the controller reads the clock once per phase
    boundary (after drafting, after verifying, after committing), so timing costs
    at most one synchronisation per phase, and the verify phase already
    synchronises to read the accepted count. On other devices it is a plain host
    clock.

    Only the current (compute) stream is waited for, not the whole device: expert
    prefetches issued while drafting run on a copy stream and must go on landing
    while the target verifies (resident experts first). A device-wide synchronise
    at the end of drafting would hold verification back until every prefetch had
    landed, and would count those transfers as drafting time.

    Args:
        device: the device whose work is being timed.
    """

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._synchronize = self.device.type == "cuda"

    def __call__(self) -> float:
        """Seconds on a monotonic clock, after the compute stream's work is done."""
        if self._synchronize:
            torch.cuda.current_stream(self.device).synchronize()
        return time.perf_counter()
