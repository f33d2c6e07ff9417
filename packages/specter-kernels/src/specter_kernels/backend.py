"""Backend dispatch: Triton kernels on CUDA, plain torch references elsewhere.

Every public kernel in this package has a Triton implementation and a torch
reference. ``select_backend`` picks one per call from the device of the inputs
and the ``SPECTER_KERNELS_BACKEND`` environment variable:

* ``auto`` (default): Triton when the inputs live on a CUDA device, torch otherwise.
* ``triton``: always Triton. On the CPU this needs the Triton interpreter
  (``TRITON_INTERPRET=1`` set before triton is imported), which the tests use.
* ``torch``: always the torch reference.

The variable is read on every call (a dictionary lookup) so tests and
benchmarks can switch backends without re-importing anything.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Literal

import torch

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
"""The dtypes the elementwise and normalisation kernels (``rms_norm``, the rotary
embeddings) take."""

BACKEND_ENV_VAR = "SPECTER_KERNELS_BACKEND"
Backend = Literal["triton", "torch"]
_CHOICES = ("auto", "triton", "torch")


def triton_available() -> bool:
    """Whether the ``triton`` package can be imported in this environment."""
    return importlib.util.find_spec("triton") is not None


def triton_interpreter_enabled() -> bool:
    """Whether Triton runs kernels on the CPU through its interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def requested_backend() -> str:
    """The backend asked for by ``SPECTER_KERNELS_BACKEND`` (``auto`` when unset).

    Raises:
        ValueError: the variable holds something other than auto, triton or torch.
    """
    value = os.environ.get(BACKEND_ENV_VAR, "auto").strip().lower() or "auto"
    if value not in _CHOICES:
        raise ValueError(
            f"{BACKEND_ENV_VAR}={value!r} is not a backend; expected one of {_CHOICES}. "
            f"Unset it or set it to 'auto' to pick Triton on CUDA and torch elsewhere."
        )
    return value


def select_backend(device: torch.device) -> Backend:
    """Pick the implementation for inputs that live on ``device``.

    Args:
        device: the device of the kernel's inputs.

    Returns:
        ``"triton"`` or ``"torch"``.

    Raises:
        RuntimeError: Triton was forced but cannot run here (not installed, or a
            CPU device without ``TRITON_INTERPRET=1``).
    """
    requested = requested_backend()
    if requested == "torch":
        return "torch"
    on_cuda = device.type == "cuda"
    if requested == "auto":
        return "triton" if on_cuda and triton_available() else "torch"
    if not triton_available():
        raise RuntimeError(
            f"{BACKEND_ENV_VAR}=triton but triton is not installed; install triton "
            f"or set {BACKEND_ENV_VAR}=torch."
        )
    if not on_cuda and not triton_interpreter_enabled():
        raise RuntimeError(
            f"{BACKEND_ENV_VAR}=triton with inputs on {device}: Triton runs on CPU tensors only "
            "under its interpreter. Set TRITON_INTERPRET=1 before importing triton, move the "
            f"inputs to a CUDA device, or set {BACKEND_ENV_VAR}=torch."
        )
    return "triton"
