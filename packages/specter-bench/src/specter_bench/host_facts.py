"""The host beside the GPU: its CPU model and a measured memory bandwidth.

Figures of the CPU expert path depend on the host as much as on the GPU, so records and
``specter info`` name the CPU (``/proc/cpuinfo``) and a memory bandwidth measured with a
copy of a buffer larger than any cache, on torch's threads.
"""

from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import torch

__all__ = ["cpu_model", "host_facts", "memory_bandwidth_gb_per_s"]


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU's model name (``/proc/cpuinfo``'s first ``model name``, else the platform's
    processor string, else ``"unknown"``)."""
    try:
        for line in cpuinfo.read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def memory_bandwidth_gb_per_s(megabytes: int = 256, repeats: int = 3) -> float:
    """Host memory bandwidth in GB/s: the best of ``repeats`` copies of a ``megabytes`` MB
    buffer into another on torch's CPU threads, counting the bytes read and written."""
    count = megabytes * (1 << 20) // 4
    source = torch.ones(count, dtype=torch.float32)
    target = torch.empty_like(source)
    target.copy_(source)  # first touch: the pages exist before the timed copies
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        target.copy_(source)
        best = min(best, time.perf_counter() - started)
    return 2 * source.nbytes / best / 1e9


def host_facts(*, measure_bandwidth: bool = True) -> dict[str, object]:
    """``cpu`` (model), ``cores``, ``torch_threads`` and, with ``measure_bandwidth``,
    ``memory_gb_per_s``."""
    facts: dict[str, object] = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }
    if measure_bandwidth:
        facts["memory_gb_per_s"] = round(memory_bandwidth_gb_per_s(), 2)
    return facts
