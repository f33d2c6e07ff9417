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
(:mod:`specter_kernels.invariant_gemv_triton`).

``SPECTER_KERNELS_PDL`` picks the mode (:data:`PDL_MODES`):

* ``wait``: the wait only. A kernel's successor may launch as the kernel's
  programs exit, so the successor's launch overlaps the kernel's completion.
* ``trigger``: after the wait, each program also lets the successor launch at once
  (``griddepcontrol.launch_dependents``); the successor's programs then wait on the SMs
  while this kernel runs.
* ``early`` (the default): ``trigger`` in the small kernels (norms, elementwise glue, the
  router, the attention's chunks and merge: launches that pass ``early_trigger=True``),
  ``wait`` in the weight-streaming ones (GEMVs, grouped experts). A small kernel's
  successor then launches while it runs, so a GEMV that issues its weight loads before its
  wait (``SPECTER_INVARIANT_GEMV_PRELOAD``, on by default; the weights are constants that
  no kernel of the step writes) streams them during the small kernel.
  On the H200 (DeepSeek-V2-Lite, one process an arm) it took the one-row target step from
  2.22 to 2.14 ms and plain decoding's TPOT from 2.33 to 2.19 ms; ``trigger`` everywhere
  made the step 0.1-0.2 ms slower (the big kernels' successors parked on the SMs).
* ``0``: off.

``pdl_options(device)`` gives a launch's arguments: on a CUDA device of compute capability
9.0 or more, with the Triton compiler (not the interpreter), ``{"PDL": mode, "launch_pdl":
True}``; otherwise ``{"PDL": 0}``. CUDA graphs keep the programmatic edges of a captured
stream. Every eager launch asks, so the variable and ``TRITON_INTERPRET`` are read once, at
the first launch (reading the environment cost about 4 us a launch on a slow host);
:func:`refresh_pdl_settings` reads them again.
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
"""The PDL mode: ``early`` (default), ``wait``, ``trigger``, or ``0`` (off); see the module
docstring."""
PDL_MODES = {"0": 0, "off": 0, "wait": 1, "1": 1, "trigger": 2, "early": 3}
"""Values of ``SPECTER_KERNELS_PDL`` and the mode each names (the ``PDL`` constexpr, except
``early``, which gives 2 to launches with ``early_trigger`` and 1 to the others)."""
EARLY = 3


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


def pdl_mode() -> int:
    """The mode ``SPECTER_KERNELS_PDL`` asks for now (:data:`EARLY` when unset).

    Raises:
        ValueError: the variable holds something other than the :data:`PDL_MODES`.
    """
    value = os.environ.get(PDL_ENV_VAR, "early").strip().lower() or "early"
    if value not in PDL_MODES:
        raise ValueError(
            f"{PDL_ENV_VAR}={value!r} is not a PDL mode; expected one of {sorted(PDL_MODES)} "
            "('early' is the default, '0' turns PDL off)"
        )
    return PDL_MODES[value]


@functools.cache
def _settings() -> int:
    """The PDL mode launches use: 0 under the interpreter, else :func:`pdl_mode` (cached)."""
    return 0 if triton_interpreter_enabled() else pdl_mode()


def refresh_pdl_settings() -> None:
    """Read ``SPECTER_KERNELS_PDL`` and ``TRITON_INTERPRET`` again at the next launch."""
    _settings.cache_clear()


_OFF: dict[str, int | bool] = {"PDL": 0}


def pdl_options(device: torch.device, early_trigger: bool = False) -> dict[str, int | bool]:
    """Launch keyword arguments of a kernel that calls :func:`pdl_enter` (see the module).

    ``early_trigger`` marks a small kernel: in the ``early`` mode it lets its successor
    launch at once (``PDL`` 2); other launches only wait (``PDL`` 1).
    """
    mode = _settings()
    if mode == 0 or device.type != "cuda":
        return _OFF
    if mode == EARLY:
        mode = 2 if early_trigger else 1
    index = device.index if device.index is not None else torch.cuda.current_device()
    return {"PDL": mode, "launch_pdl": True} if _capable(index) else _OFF


def pdl_enabled(device: torch.device) -> bool:
    """Whether kernels launched for inputs on ``device`` use programmatic dependent launch."""
    return pdl_options(device)["PDL"] != 0
