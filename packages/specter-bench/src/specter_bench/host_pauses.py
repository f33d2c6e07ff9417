"""Host pauses a decode can hide behind: Python's garbage collections and the CUDA caching
allocator going back to the driver.

A system whose decode is host-bound (an expert cache's per-layer bookkeeping, eager
launches) is slowed by both, and neither shows in the transfer stall. :class:`HostPauses`
counts them over one generation, so a slow record says whether they were there.
"""

from __future__ import annotations

import gc
import time
from types import TracebackType
from typing import Any

import torch

__all__ = ["HostPauses"]

_ALLOCATOR_KEYS = ("num_alloc_retries", "num_device_alloc", "num_device_free")


class HostPauses:
    """A context manager timing garbage collections and counting allocator calls inside it.

    Args:
        device: the CUDA device whose allocator is watched (None or a CPU device: none).

    After the block, :meth:`as_dict` gives ``gc_ms`` (wall time inside collections),
    ``gc_collections`` (per generation) and, on CUDA, the allocator's retries (a failed
    allocation that freed its cache and tried again) and device allocations and frees
    (``cudaMalloc``/``cudaFree``, which synchronise) made inside the block.
    """

    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device if device is not None and device.type == "cuda" else None
        self.gc_seconds = 0.0
        self.collections = [0, 0, 0]
        self.allocator: dict[str, int] = {}
        self._started: float | None = None
        self._before: dict[str, int] = {}

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self.gc_seconds += time.perf_counter() - self._started
            self._started = None
            self.collections[int(info.get("generation", 2))] += 1

    def _allocator_counts(self) -> dict[str, int]:
        if self.device is None:
            return {}
        stats = torch.cuda.memory_stats(self.device)
        return {key: int(stats.get(key, 0)) for key in _ALLOCATOR_KEYS}

    def __enter__(self) -> HostPauses:
        self._before = self._allocator_counts()
        gc.callbacks.append(self._on_gc)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        gc.callbacks.remove(self._on_gc)
        after = self._allocator_counts()
        self.allocator = {key: after[key] - self._before.get(key, 0) for key in after}

    def as_dict(self) -> dict[str, Any]:
        """``{"gc_ms", "gc_collections", "allocator"}`` of the block."""
        return {
            "gc_ms": 1e3 * self.gc_seconds,
            "gc_collections": list(self.collections),
            "allocator": dict(self.allocator),
        }
