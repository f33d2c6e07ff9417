"""Programmatic dependent launch (PDL) of the decode kernels on Hopper and later GPUs.

A decode step is hundreds of small kernels, and on an H200 each one pays a launch gap
after its predecessor finishes (one to two microseconds inside a CUDA graph) before its
first load is issued. With PDL a kernel is launched with the programmatic stream
serialization attribute: its programs may be scheduled while the previous kernel still
runs, and each of them waits in ``griddepcontrol.wait`` until that kernel has completed and
its writes are visible. Every kernel of this package that takes part calls
:func:`pdl_enter` first, before any load or store, so it reads and writes exactly what it
would without PDL: only the launch overlaps. After the wait it lets its own successor
launch (``griddepcontrol.launch_dependents``).

``pdl_options(device)`` gives the launch arguments: on a CUDA device of compute capability
9.0 or more, with the Triton compiler (not the interpreter) and unless
``SPECTER_KERNELS_PDL=0``, ``{"PDL": True, "launch_pdl": True}``; otherwise
``{"PDL": False}``. CUDA graphs keep the programmatic edges of a captured stream.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from specter_kernels.backend import triton_interpreter_enabled

PDL_ENV_VAR = "SPECTER_KERNELS_PDL"
"""``0`` turns programmatic dependent launch off; anything else (or unset) leaves it on."""


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """A kernel's first statement: with PDL, wait for the previous kernel to complete (its
    writes visible), then allow the next kernel to launch; without, nothing."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@functools.cache
def _capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def pdl_enabled(device: torch.device) -> bool:
    """Whether kernels launched for inputs on ``device`` use programmatic dependent launch."""
    if device.type != "cuda" or triton_interpreter_enabled():
        return False
    if os.environ.get(PDL_ENV_VAR, "1").strip() == "0":
        return False
    return _capable(device.index if device.index is not None else torch.cuda.current_device())


def pdl_options(device: torch.device) -> dict[str, bool]:
    """Launch keyword arguments of a kernel that calls :func:`pdl_enter` (see the module)."""
    if pdl_enabled(device):
        return {"PDL": True, "launch_pdl": True}
    return {"PDL": False}
