"""The identity of a benchmark run: code, machine, library versions and weights."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path

import torch

from specter_bench.host_facts import cpu_model

__all__ = ["collect_identity", "git_commit", "gpu_name", "package_versions"]

_PACKAGES = (
    "torch",
    "transformers",
    "triton",
    "accelerate",
    "specter-kernels",
    "specter-cache",
    "specter-spec",
    "specter-models",
    "specter-bench",
)


def git_commit(root: str | os.PathLike[str] | None = None) -> str:
    """``HEAD``'s commit of the checkout holding ``root`` (this file's by default).

    A ``+dirty`` suffix says uncommitted changes were present; ``"unknown"`` when there is
    no git or no checkout (an installed wheel). ``SPECTER_GIT_COMMIT`` overrides, for
    machines that receive a copy of the tree without its ``.git``.
    """
    if os.environ.get("SPECTER_GIT_COMMIT"):
        return os.environ["SPECTER_GIT_COMMIT"]
    where = Path(root) if root is not None else Path(__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10
        )
        if commit.returncode != 0:
            return "unknown"
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=where,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    dirty = "+dirty" if status.returncode == 0 and status.stdout.strip() else ""
    return commit.stdout.strip() + dirty


def gpu_name(device: torch.device | str | None = None) -> str | None:
    """The CUDA device's name, or None on a machine without one."""
    if not torch.cuda.is_available():
        return None
    device = torch.device(device) if device is not None else torch.device("cuda")
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_name(device)


def package_versions() -> dict[str, str | None]:
    """Installed versions of torch, transformers, triton, accelerate and the Specter packages.

    Modules imported from source (``PYTHONPATH``, no distribution) report their
    ``__version__``; missing ones None.
    """
    out: dict[str, str | None] = {}
    for name in _PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            module = name.replace("-", "_")
            try:
                out[name] = getattr(__import__(module), "__version__", None)
            except ImportError:
                out[name] = None
    return out


def collect_identity(
    *, weights: str, device: torch.device | str, dtype: torch.dtype | str | None = None
) -> dict[str, object]:
    """Everything a record needs to say which run it came from.

    Args:
        weights: ``"random (seed N)"`` or a checkpoint path.
        device: the device the run used.
        dtype: the target's dtype.

    Returns:
        ``git_commit``, ``gpu``, ``device``, ``dtype``, ``weights``, ``python``, ``versions``
        (package -> version), ``host``, ``host_cpu`` (its CPU model) and ``started_at`` (UTC,
        ISO 8601).
    """
    return {
        "git_commit": git_commit(),
        "gpu": gpu_name(device),
        "device": str(device),
        "dtype": str(dtype).replace("torch.", "") if dtype is not None else None,
        "weights": weights,
        "python": platform.python_version(),
        "versions": package_versions(),
        "host": platform.node(),
        "host_cpu": cpu_model(),
        "started_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    }
