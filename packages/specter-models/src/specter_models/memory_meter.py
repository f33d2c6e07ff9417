"""Peak host and GPU memory over a span of work (model loading).

Host: the resident-set high-water mark from ``/proc/self/status`` (``VmHWM``), reset at the
start through ``/proc/self/clear_refs`` when the kernel allows it (else the process's
lifetime peak is reported, and ``host_peak_is_lifetime`` says so). Pinned expert blocks are
resident memory, so they count. GPU: ``torch.cuda.max_memory_allocated`` since a reset.
"""

from __future__ import annotations

import resource
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class MemoryPeaks:
    """Memory measured over a span (bytes).

    Attributes:
        host_rss_before: resident host memory at the start.
        host_rss_after: resident host memory at the end.
        host_rss_peak: peak resident host memory during the span.
        host_peak_is_lifetime: the peak could not be reset and covers the whole process.
        gpu_allocated_before: allocated GPU memory at the start (0 without CUDA).
        gpu_allocated_after: allocated GPU memory at the end.
        gpu_peak_allocated: peak allocated GPU memory during the span.
    """

    host_rss_before: int
    host_rss_after: int
    host_rss_peak: int
    host_peak_is_lifetime: bool
    gpu_allocated_before: int
    gpu_allocated_after: int
    gpu_peak_allocated: int

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _status_bytes(field: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` in bytes, None where there is no procfs."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def host_rss_bytes() -> int:
    """Current resident host memory of this process."""
    rss = _status_bytes("VmRSS")
    if rss is not None:
        return rss
    return _lifetime_peak()  # no procfs: the best available figure


def _lifetime_peak() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def _reset_host_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # 5: reset the peak RSS (VmHWM)
        return True
    except OSError:
        return False


class MemoryMeter:
    """Measure peak host and GPU memory between ``start`` and ``stop``.

    Args:
        device: the GPU whose allocations count (ignored without CUDA).

    Example:
        >>> meter = MemoryMeter("cpu")
        >>> meter.start()
        >>> block = bytearray(50_000_000)
        >>> peaks = meter.stop()
        >>> peaks.host_rss_peak >= peaks.host_rss_before
        True
    """

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self._before: tuple[int, int] | None = None
        self._reset = False

    def start(self) -> None:
        """Reset the peaks and note the current usage."""
        gpu = 0
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
            gpu = torch.cuda.memory_allocated(self.device)
        self._reset = _reset_host_peak()
        self._before = (host_rss_bytes(), gpu)

    def stop(self) -> MemoryPeaks:
        """Peaks since ``start``.

        Raises:
            RuntimeError: ``start`` was not called.
        """
        if self._before is None:
            raise RuntimeError("MemoryMeter.stop() before start()")
        rss_after = host_rss_bytes()
        peak = _status_bytes("VmHWM") if self._reset else None
        gpu_after = gpu_peak = 0
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            gpu_after = torch.cuda.memory_allocated(self.device)
            gpu_peak = torch.cuda.max_memory_allocated(self.device)
        return MemoryPeaks(
            host_rss_before=self._before[0],
            host_rss_after=rss_after,
            host_rss_peak=max(peak if peak is not None else _lifetime_peak(), rss_after),
            host_peak_is_lifetime=peak is None,
            gpu_allocated_before=self._before[1],
            gpu_allocated_after=gpu_after,
            gpu_peak_allocated=gpu_peak,
        )
