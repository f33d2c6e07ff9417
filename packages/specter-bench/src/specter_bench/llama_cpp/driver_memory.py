"""The GPU's used memory as the driver reports it, sampled while another process runs.

llama.cpp reports no peak memory of its own, and this process must not open a CUDA context
beside it (that would take memory on the same GPU), so ``nvidia-smi`` is polled every
``interval_ms`` in the background: the peak is the most ``memory.used`` any sample read,
the CUDA context of the measured process included.
"""

from __future__ import annotations

import shutil
import subprocess
import threading

__all__ = ["DriverMemorySampler", "gpu_name_from_driver"]

_QUERY = ["--query-gpu=memory.used", "--format=csv,noheader,nounits"]


class DriverMemorySampler:
    """Context manager: polls ``nvidia-smi`` for GPU ``index`` while the block runs.

    ``peak_gb`` and ``baseline_gb`` (used memory before the block) are in GB (1e9 bytes),
    None where ``nvidia-smi`` is missing or read nothing.
    """

    def __init__(self, index: int = 0, interval_ms: int = 100) -> None:
        self.index = index
        self.interval_ms = interval_ms
        self.baseline_gb: float | None = None
        self.peak_gb: float | None = None
        self._process: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None
        self._samples: list[float] = []

    def __enter__(self) -> DriverMemorySampler:
        smi = shutil.which("nvidia-smi")
        if smi is None:
            return self
        self.baseline_gb = _read_once(smi, self.index)
        self._process = subprocess.Popen(
            [smi, *_QUERY, f"--id={self.index}", f"-lms={self.interval_ms}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=10)
        if self._reader is not None:
            self._reader.join(timeout=10)
        if self._samples:
            self.peak_gb = max(self._samples)

    def _read(self) -> None:
        assert self._process is not None
        assert self._process.stdout is not None
        for line in self._process.stdout:
            value = _mib_to_gb(line)
            if value is not None:
                self._samples.append(value)


def gpu_name_from_driver(index: int = 0) -> str | None:
    """The GPU's name from ``nvidia-smi`` (None without it)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    out = subprocess.run(
        [smi, "--query-gpu=name", "--format=csv,noheader", f"--id={index}"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return out.stdout.strip() or None if out.returncode == 0 else None


def _read_once(smi: str, index: int) -> float | None:
    out = subprocess.run(
        [smi, *_QUERY, f"--id={index}"], capture_output=True, text=True, timeout=30
    )
    return _mib_to_gb(out.stdout) if out.returncode == 0 else None


def _mib_to_gb(text: str) -> float | None:
    try:
        return float(text.strip().splitlines()[0]) * 2**20 / 1e9
    except (ValueError, IndexError):
        return None
