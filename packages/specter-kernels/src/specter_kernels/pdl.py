"""Programmatic dependent launch (PDL) of the decode kernels on Hopper and later GPUs.

A decode step is hundreds of small kernels, and on an H200 each one pays a launch gap
after its predecessor finishes (one to two microseconds inside a CUDA graph) before its
first load is issued. With PDL a kernel is launched with the programmatic stream
serialization attribute: it may be launched before the previous kernel has completed, and
each of its programs waits in ``griddepcontrol.wait`` until that kernel has completed and
its writes are visible. Every kernel of this package that takes part calls
:func:`pdl_enter` before any load or store of what an earlier kernel may write, so it reads
and writes exactly what it would without PDL. The one load issued before the wait is the
invariant GEMV's of a weight its caller promised constant
(:mod:`specter_kernels.invariant.gemv_triton`).

The small kernels (norms, elementwise glue, the router, the attention's chunks and merge:
launches that pass ``early_trigger=True``) let their successor launch at once after their
wait (``griddepcontrol.launch_dependents``); the weight-streaming ones (GEMVs, grouped
experts) only wait. A small kernel's successor then launches while it runs, so a GEMV that
issues its weight loads before its wait (the weights are constants that no kernel of the
step writes) streams them during the small kernel. On an H200 (DeepSeek-V2-Lite, one process
an arm) this took the one-row target step from 2.22 to 2.14 ms and plain decoding's TPOT from
2.33 to 2.19 ms against every kernel only waiting; every kernel triggering made the step
0.1-0.2 ms slower than only waiting (the big kernels' successors parked on the SMs).

``pdl_options(device)`` gives a launch's arguments: on a CUDA device of compute capability
9.0 or more, with the Triton compiler (not the interpreter), ``{"PDL": 1 or 2, "launch_pdl":
True}``; otherwise ``{"PDL": 0}``. CUDA graphs keep the programmatic edges of a captured
stream. Every eager launch asks, so ``TRITON_INTERPRET`` is read once, at the first launch
(reading the environment cost about 4 us a launch on a slow host);
:func:`refresh_pdl_settings` reads it again.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from specter_kernels.backend import triton_interpreter_enabled


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """A kernel's first statement: with PDL (``PDL >= 1``), wait for the previous kernel to
    complete (its writes visible); with ``PDL == 2`` then allow the next kernel to launch;
    without PDL, nothing."""
    if PDL >= 1:
        gdc_wait()
    if PDL >= 2:
        gdc_launch_dependents()


@functools.cache
def _capable(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


@functools.cache
def _interpreted() -> bool:
    """Whether launches run under the Triton interpreter (no PDL there; cached)."""
    return triton_interpreter_enabled()


def refresh_pdl_settings() -> None:
    """Read ``TRITON_INTERPRET`` again at the next launch."""
    _interpreted.cache_clear()


_OFF: dict[str, int | bool] = {"PDL": 0}


def pdl_options(device: torch.device, early_trigger: bool = False) -> dict[str, int | bool]:
    """Launch keyword arguments of a kernel that calls :func:`pdl_enter` (see the module).

    ``early_trigger`` marks a small kernel: it lets its successor launch at once (``PDL``
    2); other launches only wait (``PDL`` 1).
    """
    if device.type != "cuda" or _interpreted():
        return _OFF
    mode = 2 if early_trigger else 1
    index = device.index if device.index is not None else torch.cuda.current_device()
    return {"PDL": mode, "launch_pdl": True} if _capable(index) else _OFF


def pdl_enabled(device: torch.device) -> bool:
    """Whether kernels launched for inputs on ``device`` use programmatic dependent launch."""
    return pdl_options(device)["PDL"] != 0
