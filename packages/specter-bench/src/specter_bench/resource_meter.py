"""What the benchmark process costs a user: time since it started, host memory, and GPU
memory as the driver sees it.

* **Time since the process started**: from the kernel's start time of this process
  (``/proc/self/stat`` against ``/proc/uptime``, 10 ms resolution), so a load time counts
  the interpreter's start and every import, as a user waits for them; where ``/proc`` is
  missing, from when this module was imported (and :func:`process_clock_origin` says so).
* **Host memory**: the process's peak resident set (``getrusage``) and its resident set now
  (``/proc/self/statm``).
* **GPU memory, the driver's view**: ``torch.cuda.mem_get_info`` (total less free, every
  allocation of the device: the CUDA context, the caching allocator's reserved blocks,
  libraries' own) sampled at step boundaries by :class:`DeviceMemory`. The caching
  allocator keeps what it reserved until it is emptied, so a sample at the end of a decode
  is the most its blocks reached during it; the samples never synchronise the device.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from typing import Any

import torch

__all__ = [
    "DeviceMemory",
    "host_memory_bytes",
    "process_clock_origin",
    "seconds_since_start",
]

GB = 1e9


def _started_seconds_ago() -> float | None:
    """Seconds since the kernel started this process, None without ``/proc``."""
    try:
        with open("/proc/self/stat", encoding="ascii") as handle:
            # The command name (field 2) may hold spaces and parentheses: split after it.
            fields = handle.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime", encoding="ascii") as handle:
            uptime = float(handle.read().split()[0])
        started_ticks = int(fields[19])  # field 22 of the whole line: starttime
        return max(0.0, uptime - started_ticks / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


_AGO = _started_seconds_ago()
_ORIGIN = time.monotonic() - (_AGO if _AGO is not None else 0.0)


def process_clock_origin() -> str:
    """What :func:`seconds_since_start` counts from (recorded with load times)."""
    if _AGO is None:
        return "the benchmark module's import (no /proc here)"
    return "the process's start (/proc/self/stat)"


def seconds_since_start() -> float:
    """Seconds since this process started (see :func:`process_clock_origin`)."""
    return time.monotonic() - _ORIGIN


def host_memory_bytes() -> dict[str, int | None]:
    """``{"peak_rss": bytes, "rss": bytes}``: the process's peak resident set so far and its
    resident set now (None where the platform does not say)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak_bytes = peak if sys.platform == "darwin" else 1024 * peak  # Linux: KiB
    rss = None
    try:
        with open("/proc/self/statm", encoding="ascii") as handle:
            rss = int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        pass
    return {"peak_rss": peak_bytes, "rss": rss}


class DeviceMemory:
    """Samples of the device's used memory as the driver reports it (None on a CPU).

    Args:
        device: the device the engine runs on.

    Attributes:
        total: the device's memory in bytes (None on a CPU).
        peak: the most used memory among the samples so far (None before any, or on a CPU).
        last: the latest sample.
    """

    def __init__(self, device: Any) -> None:
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.total: int | None = None
        self.peak: int | None = None
        self.last: int | None = None

    def sample(self) -> int | None:
        """Used bytes now (total less free), folded into :attr:`peak`; None on a CPU."""
        if not self.cuda:
            return None
        free, total = torch.cuda.mem_get_info(self.device)
        self.total = int(total)
        self.last = int(total - free)
        self.peak = self.last if self.peak is None else max(self.peak, self.last)
        return self.last
