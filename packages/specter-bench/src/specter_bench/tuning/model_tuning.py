"""One kernel's tuning over a model's shapes, and the tuned file it writes."""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, Literal

import torch

from specter_bench.kernel_bench import kernel_shape_of
from specter_bench.tuning.int4_sweep import Int4Tuning, tune_int4_layer
from specter_bench.tuning.invariant_sweeps import ShapeTuning, tune_gemv_shape, tune_matmul_shape
from specter_bench.tuning.linear_shapes import linear_shapes
from specter_bench.tuning.trials import Timer, Trial
from specter_kernels.invariant import gemv_config, matmul_config
from specter_kernels.moe import w4a16_configs
from specter_kernels.tuned_files import write_tuned_file

__all__ = ["KERNELS", "Kernel", "tune_model", "tuned_path", "write_tuned"]

Kernel = Literal["gemv", "matmul", "int4"]
KERNELS: tuple[Kernel, ...] = ("gemv", "matmul", "int4")
"""What ``specter tune`` tunes: the invariant GEMV, the invariant matmul, the W4A16 gemv path."""

_KEY_FIELDS = {
    "gemv": matmul_config.KEY_FIELDS,
    "matmul": matmul_config.KEY_FIELDS,
    "int4": w4a16_configs.KEY_FIELDS,
}
_SOURCE = {
    "gemv": "CUDA-graph timing over distinct weights; candidates bit-invariant between 1 and "
    "5 rows and close to the float64 product; kernel and tile by 3 x the 1-row + the 5-row time",
    "matmul": "CUDA-graph timing over distinct weights; candidates bit-invariant between 1 and "
    "5 rows and close to the float64 product; least 1-row + 5-row time",
    "int4": "one T = 1 MoE layer timed in a CUDA graph over rotating weight sets; pairs close "
    "to the torch reference; gate_up tiles beside the default down, then down tiles",
}


def tuned_path(kernel: Kernel, gpu_name: str) -> Path:
    """The tuned file of ``kernel`` the config modules read on GPU model ``gpu_name``."""
    if kernel == "gemv":
        return gemv_config.tuned_gemv_path(gpu_name)
    if kernel == "matmul":
        return matmul_config.tuned_config_path(gpu_name)
    return w4a16_configs.tuned_gemv_path(gpu_name)


def tune_model(
    kernel: Kernel,
    config: Any,
    device: torch.device | str,
    timer: Timer,
    *,
    model: str = "model",
    gpu_name: str | None = None,
    only: Collection[tuple[int, int]] | None = None,
    on_shape: Callable[[str], None] | None = None,
    on_result: Callable[[ShapeTuning | Int4Tuning], None] | None = None,
    progress: Callable[[Trial], None] | None = None,
) -> list[ShapeTuning | Int4Tuning]:
    """Tune ``kernel`` at every shape of a model.

    Args:
        kernel: ``"gemv"``, ``"matmul"`` or ``"int4"``.
        config: the model's transformers config.
        device: a CUDA device (tests: the CPU with a fake timer).
        timer: times one launch.
        model: the model's name (for the INT4 layer shape).
        gpu_name: the GPU model (its tuned tiles are among the candidates).
        only: the (N, K) linear shapes to tune (default all; not for ``"int4"``).
        on_shape: called with each shape's name before it is tuned.
        on_result: called with each shape's tuning as it ends.
        progress: called with each trial as it ends.

    Returns:
        One tuning per shape (the GEMV: per shape it can take; INT4: the one layer shape).

    Raises:
        ValueError: an unknown kernel, ``only`` with ``"int4"``, or an ``only`` shape the
            model does not have (the message lists the model's shapes).
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    results: list[ShapeTuning | Int4Tuning] = []
    if kernel == "int4":
        if only:
            raise ValueError(
                "int4 tunes the model's one routed-expert layer shape; drop the shapes"
            )
        if on_shape is not None:
            on_shape(f"{model} routed experts")
        results.append(
            tune_int4_layer(kernel_shape_of(model, config), device, timer, progress=progress)
        )
        if on_result is not None:
            on_result(results[-1])
        return results
    shapes = linear_shapes(config)
    if kernel == "gemv":
        shapes = [s for s in shapes if gemv_config.gemv_eligible(s.K, s.dtype)]
    if only:
        known = {(s.N, s.K) for s in shapes}
        missing = sorted(set(only) - known)
        if missing:
            listed = ", ".join(f"{s.N}x{s.K} ({s.name})" for s in shapes)
            raise ValueError(f"{model} has no {kernel} shapes {missing} (N, K); it has {listed}")
        shapes = [s for s in shapes if (s.N, s.K) in only]
    tune = tune_gemv_shape if kernel == "gemv" else tune_matmul_shape
    for shape in shapes:
        if on_shape is not None:
            on_shape(shape.name)
        results.append(tune(shape, device, timer, gpu_name=gpu_name, progress=progress))
        if on_result is not None:
            on_result(results[-1])
    return results


def write_tuned(
    kernel: Kernel,
    results: list[ShapeTuning | Int4Tuning],
    path: Path,
    gpu_name: str,
    command: str,
) -> tuple[int, int]:
    """Write the results' entries to the tuned file at ``path``, keeping its entries of
    other shapes; returns (entries written from ``results``, entries kept)."""
    entries = [r.entry for r in results if r.entry is not None]
    written = write_tuned_file(
        path,
        gpu_name,
        entries,
        key_fields=_KEY_FIELDS[kernel],
        source=f"{command} ({_SOURCE[kernel]})",
    )
    return len(entries), len(written) - len(entries)
