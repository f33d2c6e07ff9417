"""Tuning the batch-invariant matmul's and GEMV's tiles at one linear shape.

Each candidate runs at one row (a decode step) and five (a four-token verification) on the
same weight; it passes the gate when row 0's bits are equal at both row counts (the kernel
must stay batch-invariant) and the five rows are within :data:`TOLERANCE` of the float64
product. Passed candidates are timed over distinct weights (more bytes than the L2 holds,
:data:`GRAPH_BYTES`), as a decode step's linears run. The matmul's best tile is the least
one-row plus five-row time; the GEMV's best tile is weighed by
:data:`~specter_kernels.invariant.gemv_config.ROW_WEIGHTS` against the tensor-core kernel's
tile, which wins the shape (``"kernel": "mma"``) where it is faster.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from specter_bench.tuning.linear_shapes import LinearShape
from specter_bench.tuning.trials import Launch, Timer, Trial, best_trial, relative_error, run_trials
from specter_kernels.invariant.gemv_config import (
    ROW_WEIGHTS,
    InvariantGemvConfig,
    gemv_candidates,
    gemv_eligible,
    gemv_tuned_entry,
)
from specter_kernels.invariant.gemv_triton import launch_invariant_gemv
from specter_kernels.invariant.matmul_config import (
    MatmulConfig,
    matmul_candidates,
    matmul_config,
    matmul_tuned_entry,
)
from specter_kernels.invariant.matmul_triton import launch_invariant_bmm

__all__ = [
    "GRAPH_BYTES",
    "ROWS",
    "TOLERANCE",
    "ShapeTuning",
    "tune_gemv_shape",
    "tune_matmul_shape",
]

ROWS = (1, 5)
"""The row counts every candidate runs and is timed at."""
GRAPH_BYTES = 256 << 20
"""Weight bytes one timing streams (distinct copies, 4 to 64 of them): more than an H200's
L2 holds."""
TOLERANCE = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5}
"""Largest relative error against the float64 product a candidate may have, per dtype."""

GemvLauncher = Callable[..., torch.Tensor]
"""``(x [M, K], weight [N, K], out [M, N], bias, config) -> out``."""
MatmulLauncher = Callable[..., torch.Tensor]
"""``(a [1, M, K], b [1, K, N], out [1, M, N], bias=None, config=...) -> out``."""


@dataclass(frozen=True)
class ShapeTuning:
    """The tuning of one kernel at one linear shape.

    Attributes:
        shape: the linear.
        trials: every candidate's trial, in the order tried.
        baselines: the trials of what the candidates are compared with (the GEMV's: the
            tensor-core kernel's tile), passed through the same gate.
        linear_us: cuBLAS's (``F.linear``) time per row count, for reference.
        best: the best passed candidate (None when none passed).
        entry: the tuned-file entry (None when no candidate passed).
    """

    shape: LinearShape
    trials: list[Trial]
    baselines: list[Trial]
    linear_us: Mapping[str, float]
    best: Trial | None
    entry: dict[str, Any] | None


@dataclass(frozen=True)
class _Operands:
    """A shape's inputs: ``weights [copies, N, K]``, ``x [max(ROWS), K]`` and the float64
    product of ``x`` with ``weights[0]`` (``[max(ROWS), N]``)."""

    weights: torch.Tensor
    x: torch.Tensor
    reference: torch.Tensor

    @property
    def copies(self) -> int:
        return self.weights.shape[0]


def _operands(shape: LinearShape, device: torch.device, graph_bytes: int, seed: int) -> _Operands:
    N, K, dtype = shape.N, shape.K, shape.dtype
    copies = max(4, min(64, graph_bytes // (N * K * dtype.itemsize)))
    g = torch.Generator(device=device).manual_seed(seed)
    weights = (torch.randn(copies, N, K, device=device, generator=g) / K**0.5).to(dtype)
    x = torch.randn(max(ROWS), K, device=device, generator=g).to(dtype)
    return _Operands(weights, x, x.double() @ weights[0].double().T)


def _check(outs: Mapping[int, torch.Tensor], ops: _Operands, dtype: torch.dtype) -> str | None:
    """Why a candidate's outputs (row count -> ``[m, N]`` on ``weights[0]``) are wrong."""
    first = outs[ROWS[0]][0]
    for m in ROWS[1:]:
        if not torch.equal(first, outs[m][0]):
            return f"row 0's bits differ between {ROWS[0]} and {m} rows (not batch-invariant)"
    rows = max(ROWS)
    error = relative_error(outs[rows], ops.reference[:rows])
    if error > TOLERANCE[dtype]:
        return f"relative error {error:.1e} against the float64 product exceeds {TOLERANCE[dtype]}"
    return None


def _linear_us(ops: _Operands, timer: Timer) -> dict[str, float]:
    def launch(m: int) -> Launch:
        return Launch("cuBLAS", f"m{m}", lambda i: F.linear(ops.x[:m], ops.weights[i]), ops.copies)

    return {f"m{m}": timer(launch(m)) for m in ROWS}


def _matmul_trials(
    configs: list[MatmulConfig],
    ops: _Operands,
    dtype: torch.dtype,
    timer: Timer,
    launch_mma: MatmulLauncher,
    progress: Callable[[Trial], None] | None,
) -> list[Trial]:
    device, N = ops.x.device, ops.weights.shape[1]
    outs = {m: torch.empty(1, m, N, device=device, dtype=dtype) for m in ROWS}

    def call(config: MatmulConfig, m: int, i: int) -> torch.Tensor:
        return launch_mma(ops.x[None, :m], ops.weights[i].T[None], outs[m], config=config)

    def gate(config: MatmulConfig) -> str | None:
        return _check({m: call(config, m, 0)[0].clone() for m in ROWS}, ops, dtype)

    def launches(config: MatmulConfig) -> list[Launch]:
        return [
            Launch(config, f"m{m}", lambda i, m=m: call(config, m, i), ops.copies) for m in ROWS
        ]

    return run_trials(configs, gate, launches, timer, progress)


def tune_matmul_shape(
    shape: LinearShape,
    device: torch.device | str,
    timer: Timer,
    *,
    gpu_name: str | None = None,
    launch_mma: MatmulLauncher = launch_invariant_bmm,
    graph_bytes: int = GRAPH_BYTES,
    seed: int = 0,
    progress: Callable[[Trial], None] | None = None,
) -> ShapeTuning:
    """Gate and time every matmul tile of
    :func:`~specter_kernels.invariant.matmul_config.matmul_candidates` at ``shape``.

    Args:
        shape: the linear.
        device: where to run (a CUDA device; tests pass the CPU with a fake timer).
        timer: times one launch (:func:`~specter_bench.tuning.trials.cuda_graph_timer`).
        gpu_name: the GPU model, whose tuned tile is among the candidates.
        launch_mma: the kernel's launcher.
        graph_bytes: weight bytes a timing streams.
        seed: seed of the weights and inputs.
        progress: called with each trial as it ends.

    Returns:
        The trials and, where one passed, the entry of the least one-row plus five-row time.
    """
    ops = _operands(shape, torch.device(device), graph_bytes, seed)
    candidates = matmul_candidates(shape.N, shape.K, shape.dtype, gpu_name)
    trials = _matmul_trials(candidates, ops, shape.dtype, timer, launch_mma, progress)
    linear = _linear_us(ops, timer)
    best = best_trial(trials, lambda times: sum(times.values()))
    entry = None
    if best is not None:
        times = {f"graph_us_{label}": us for label, us in best.times_us.items()}
        times["linear_graph_us_m1"] = linear["m1"]
        entry = matmul_tuned_entry(shape.N, shape.K, shape.dtype, best.candidate, times)
    return ShapeTuning(shape, trials, [], linear, best, entry)


def weighted_us(times: Mapping[str, float]) -> float:
    """One- and five-row times weighed by ``ROW_WEIGHTS`` (the GEMV's measure)."""
    return sum(weight * times[f"m{m}"] for m, weight in ROW_WEIGHTS.items())


def tune_gemv_shape(
    shape: LinearShape,
    device: torch.device | str,
    timer: Timer,
    *,
    gpu_name: str | None = None,
    launch_gemv: GemvLauncher = launch_invariant_gemv,
    launch_mma: MatmulLauncher = launch_invariant_bmm,
    graph_bytes: int = GRAPH_BYTES,
    seed: int = 0,
    progress: Callable[[Trial], None] | None = None,
) -> ShapeTuning:
    """Gate and time every GEMV tile of
    :func:`~specter_kernels.invariant.gemv_config.gemv_candidates` at ``shape``, and the
    tensor-core kernel's tile for this GPU model beside them.

    Arguments as :func:`tune_matmul_shape`'s; ``launch_gemv`` is the GEMV's launcher.

    Returns:
        The trials and, where a tile passed, the entry: the best GEMV tile by
        :func:`weighted_us`, or ``"kernel": "mma"`` where the tensor-core tile passed and
        has the lesser weighted time (or no GEMV tile passed).

    Raises:
        ValueError: a shape the GEMV cannot take (``gemv_eligible``).
    """
    N, K, dtype = shape.N, shape.K, shape.dtype
    if not gemv_eligible(K, dtype):
        raise ValueError(
            f"{shape.name} ({N} x {K}, {dtype}) cannot take the GEMV (K must be a multiple "
            "of 8 and a row at most 32 KB); it always runs the tensor-core kernel"
        )
    ops = _operands(shape, torch.device(device), graph_bytes, seed)
    outs = {m: torch.empty(m, N, device=ops.x.device, dtype=dtype) for m in ROWS}

    def call(config: InvariantGemvConfig, m: int, i: int) -> torch.Tensor:
        return launch_gemv(ops.x[:m], ops.weights[i], outs[m], None, config)

    def gate(config: InvariantGemvConfig) -> str | None:
        return _check({m: call(config, m, 0).clone() for m in ROWS}, ops, dtype)

    def launches(config: InvariantGemvConfig) -> list[Launch]:
        return [
            Launch(config, f"m{m}", lambda i, m=m: call(config, m, i), ops.copies) for m in ROWS
        ]

    trials = run_trials(gemv_candidates(N, K, dtype, gpu_name), gate, launches, timer, progress)
    mma_tile = matmul_config(N, K, dtype, gpu_name)
    (mma,) = _matmul_trials([mma_tile], ops, dtype, timer, launch_mma, progress)
    linear = _linear_us(ops, timer)
    best = best_trial(trials, weighted_us)
    entry = None
    if best is not None or mma.passed:
        use_gemv = best is not None and (
            not mma.passed or weighted_us(best.times_us) < weighted_us(mma.times_us)
        )
        times = {} if best is None else best.times_us
        times = {f"gemv_graph_us_{label}": us for label, us in times.items()}
        times.update({f"mma_graph_us_{label}": us for label, us in mma.times_us.items()})
        times["linear_graph_us_m1"] = linear["m1"]
        config = best.candidate if use_gemv and best is not None else None
        entry = gemv_tuned_entry(N, K, dtype, config, times)
    return ShapeTuning(shape, trials, [mma], linear, best, entry)
