"""A wall clock for timing speculation phases on CPU or CUDA."""

from __future__ import annotations

import time

import torch

__all__ = ["PhaseClock"]


class PhaseClock:
    """Returns ``time.perf_counter()`` after the device's queued work has finished.

    CUDA kernels run asynchronously, so reading the host clock alone would time
    the launches, not the work. On a CUDA device each reading synchronises the
    device once; the controller reads the clock once per phase boundary (after
    drafting, after verifying, after committing), so timing costs at most one
    synchronisation per phase, and the verify phase already synchronises to read
    the accepted count. On other devices it is a plain host clock.

    Args:
        device: the device whose work is being timed.
    """

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self._synchronize = self.device.type == "cuda"

    def __call__(self) -> float:
        """Seconds on a monotonic clock, after the device is idle."""
        if self._synchronize:
            torch.cuda.synchronize(self.device)
        return time.perf_counter()
