"""Tuning the W4A16 gemv path's tiles: one MoE layer of the draft's routed experts at T = 1.

The draft's routed experts at one token run the gemv path
(:func:`specter_kernels.moe.w4a16_triton.launch_gemv`): one gate_up launch, one down launch.
A candidate is a (gate_up, down) pair; it passes the gate when the layer's output is within
:data:`TOLERANCE` of :func:`specter_kernels.fused_moe_w4a16_reference` on the same INT4
weights. Passed pairs are timed as a whole layer, rotating over :data:`WEIGHT_SETS`
distinct weight sets and inputs.

Two stages: every gate_up tile beside the default down tile, then every down tile beside the
best gate_up. The best pair of the second stage is kept where it beats the default pair.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from specter_bench.kernel_bench import KernelShape
from specter_bench.tuning.trials import Launch, Timer, Trial, best_trial, relative_error, run_trials
from specter_kernels import Int4Weight, fused_moe_w4a16_reference, quantize_int4
from specter_kernels.moe.w4a16_configs import (
    default_gemv_configs,
    gemv_down_candidates,
    gemv_gate_up_candidates,
    gemv_tuned_entry,
)
from specter_kernels.moe.w4a16_triton import GemvConfig, launch_gemv

__all__ = ["TOLERANCE", "WEIGHT_SETS", "Int4Tuning", "tune_int4_layer"]

TOLERANCE = 2e-3
"""Largest relative error against the torch reference a pair may have (the packed math's
is about 8e-4)."""
WEIGHT_SETS = 4
"""Distinct weight sets (and inputs) one timing rotates over."""

Pair = tuple[GemvConfig, GemvConfig]
GemvLayerLauncher = Callable[..., torch.Tensor]
"""``(x, topk_ids, topk_weights, w13, w2, gate_up_config, down_config) -> out [T, H]``."""


@dataclass(frozen=True)
class Int4Tuning:
    """The tuning of one layer shape.

    Attributes:
        shape: the routed-expert layer.
        trials: every pair's trial, gate_up stage first.
        default: the default pair's trial (the first of the gate_up stage).
        best: the pair kept: the best of the down stage where it beats the default, else
            the default (None when neither passed).
        entry: the tuned-file entry of ``best`` (None when there is none).
    """

    shape: KernelShape
    trials: list[Trial]
    default: Trial
    best: Trial | None
    entry: dict[str, Any] | None


@dataclass(frozen=True)
class _LayerOperands:
    w13: list[Int4Weight]
    w2: list[Int4Weight]
    x: list[torch.Tensor]
    ids: list[torch.Tensor]
    weights: list[torch.Tensor]
    reference: torch.Tensor


def _operands(shape: KernelShape, device: torch.device, sets: int, seed: int) -> _LayerOperands:
    H, inter, E, k = shape.hidden, shape.intermediate, shape.num_experts, shape.top_k
    g = torch.Generator(device=device).manual_seed(seed)

    def weight(n: int, kk: int) -> Int4Weight:
        dense = torch.randn(E, n, kk, device=device, generator=g) * 0.02
        return quantize_int4(dense.half(), shape.group_size)

    w13 = [weight(2 * inter, H) for _ in range(sets)]
    w2 = [weight(H, inter) for _ in range(sets)]
    x = [torch.randn(1, H, device=device, generator=g).half() for _ in range(sets)]
    ids = [torch.randperm(E, device=device, generator=g)[:k].view(1, k).int() for _ in range(sets)]
    weights = [torch.rand(1, k, device=device, generator=g).softmax(-1) for _ in range(sets)]
    reference = fused_moe_w4a16_reference(x[0], ids[0], weights[0], w13[0], w2[0])
    return _LayerOperands(w13, w2, x, ids, weights, reference)


def tune_int4_layer(
    shape: KernelShape,
    device: torch.device | str,
    timer: Timer,
    *,
    launch: GemvLayerLauncher = launch_gemv,
    gate_up_candidates: list[GemvConfig] | None = None,
    down_candidates: list[GemvConfig] | None = None,
    sets: int = WEIGHT_SETS,
    seed: int = 0,
    progress: Callable[[Trial], None] | None = None,
) -> Int4Tuning:
    """Gate and time the gemv path's (gate_up, down) pairs for one layer shape at T = 1.

    Args:
        shape: the routed-expert layer (``hidden``, ``intermediate``, ``num_experts``,
            ``top_k``, ``group_size``).
        device: where to run (a CUDA device; tests pass the CPU with a fake timer).
        timer: times one launch (:func:`~specter_bench.tuning.trials.cuda_graph_timer`).
        launch: the layer's launcher.
        gate_up_candidates, down_candidates: the tiles tried (default
            ``gemv_gate_up_candidates()`` and ``gemv_down_candidates(I)``, defaults first).
        sets: distinct weight sets a timing rotates over.
        seed: seed of the weights, inputs and routing.
        progress: called with each trial as it ends.
    """
    ops = _operands(shape, torch.device(device), sets, seed)
    default_gate_up, default_down = default_gemv_configs(shape.intermediate)
    gate_ups = gate_up_candidates or gemv_gate_up_candidates()
    downs = down_candidates or gemv_down_candidates(shape.intermediate)

    def call(pair: Pair, i: int) -> torch.Tensor:
        gate_up, down = pair
        return launch(ops.x[i], ops.ids[i], ops.weights[i], ops.w13[i], ops.w2[i], gate_up, down)

    def gate(pair: Pair) -> str | None:
        error = relative_error(call(pair, 0), ops.reference)
        if error > TOLERANCE:
            return f"relative error {error:.1e} against the torch reference exceeds {TOLERANCE}"
        return None

    def launches(pair: Pair) -> list[Launch]:
        return [Launch(pair, "layer", lambda i: call(pair, i), sets)]

    def layer_us(times: dict[str, float]) -> float:
        return times["layer"]

    first = [(default_gate_up, default_down)]
    first += [(g, default_down) for g in gate_ups if g != default_gate_up]
    gate_up_trials = run_trials(first, gate, launches, timer, progress)
    best_gate_up = best_trial(gate_up_trials, layer_us)
    chosen_gate_up = best_gate_up.candidate[0] if best_gate_up else default_gate_up
    second = [(chosen_gate_up, d) for d in dict.fromkeys([default_down, *downs])]
    down_trials = run_trials(second, gate, launches, timer, progress)
    default = gate_up_trials[0]
    best = best_trial(down_trials, layer_us)
    if best is None or (default.passed and layer_us(default.times_us) <= layer_us(best.times_us)):
        best = default if default.passed else None
    entry = None
    if best is not None:
        times = {"layer_graph_us": best.times_us["layer"]}
        if default.passed:
            times["default_layer_graph_us"] = default.times_us["layer"]
        gate_up, down = best.candidate
        entry = gemv_tuned_entry(
            shape.hidden, shape.intermediate, shape.top_k, gate_up, down, times
        )
    return Int4Tuning(shape, gate_up_trials + down_trials, default, best, entry)
