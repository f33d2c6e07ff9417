"""``specter kernel-bench``: one routed-expert MoE layer through three execution paths.

For a model's routed-expert shape (hidden ``H``, expert intermediate ``I``, ``E`` experts,
top-``k``) and each token count ``T``, the same inputs and the same represented weights go
through:

* ``fused_w4a16``: ``specter_kernels.fused_moe_w4a16``, every routed expert in one launch
  (the draft's kernel);
* ``per_expert_w4a16``: the same INT4 weights, one W4A16 call per used expert on its gathered
  tokens, results added back (an unfused draft: what the fused kernel saves);
* ``fp16_grouped``: the INT4 weights dequantized once to FP16, all experts resident, through
  ``specter_kernels.grouped_moe_fp16`` (the target's kernel over cache slots).

Each path is first checked against ``fused_moe_w4a16_reference`` (relative Frobenius error),
then timed: median of ``repeats`` calls after warm-up, with CUDA events on a GPU and the host
clock elsewhere (on a CPU every path is the torch reference: the numbers only show that the
command works). This is the paper's fused-draft-kernel comparison, per layer.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch

from specter_bench.unfused_draft import per_expert_w4a16
from specter_kernels import (
    Int4Weight,
    dequantize_int4,
    fused_moe_w4a16,
    fused_moe_w4a16_reference,
    grouped_moe_fp16,
    quantize_int4,
    select_backend,
)

__all__ = ["KernelShape", "KernelTiming", "kernel_shape_of", "run_kernel_bench"]

PATHS = ("fused_w4a16", "per_expert_w4a16", "fp16_grouped")


@dataclass(frozen=True)
class KernelShape:
    """A routed-expert layer's shape.

    Attributes:
        name: the model it comes from.
        hidden: H.
        intermediate: I, one expert's intermediate size.
        num_experts: E.
        top_k: k.
        group_size: INT4 quantization group (divides H and I).
    """

    name: str
    hidden: int
    intermediate: int
    num_experts: int
    top_k: int
    group_size: int = 128


def kernel_shape_of(name: str, config: object) -> KernelShape:
    """The routed-expert shape of a transformers MoE config (deepseek_v2, qwen2_moe, phimoe).

    Raises:
        ValueError: the config has no routed experts Specter knows how to read.
    """
    hidden = getattr(config, "hidden_size", None)
    intermediate = getattr(config, "moe_intermediate_size", None)
    if intermediate is None and getattr(config, "model_type", "") == "phimoe":
        intermediate = config.intermediate_size  # type: ignore[attr-defined]
    experts = next(
        (
            getattr(config, a)
            for a in ("n_routed_experts", "num_experts", "num_local_experts")
            if getattr(config, a, None)
        ),
        None,
    )
    top_k = getattr(config, "num_experts_per_tok", None)
    if None in (hidden, intermediate, experts, top_k):
        raise ValueError(
            f"{name}: cannot read the routed-expert shape (hidden_size, moe_intermediate_size, "
            "number of experts, num_experts_per_tok) from its config; supported model types "
            "are deepseek_v2, qwen2_moe and phimoe."
        )
    group = max(g for g in (32, 64, 128) if hidden % g == 0 and intermediate % g == 0)
    return KernelShape(name, hidden, intermediate, experts, top_k, group)


@dataclass(frozen=True)
class KernelTiming:
    """One (shape, T, path) measurement."""

    model: str
    tokens: int
    path: str
    median_ms: float
    relative_error: float
    backend: str
    device: str

    def as_dict(self) -> dict[str, object]:
        """Plain-Python view, for JSON."""
        return asdict(self)


def _make_paths(
    w13: Int4Weight, w2: Int4Weight, device: torch.device
) -> dict[str, Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]]:
    E = w13.num_experts
    gate_up16 = dequantize_int4(w13, torch.float16).contiguous()
    down16 = dequantize_int4(w2, torch.float16).contiguous()
    identity = torch.arange(E, dtype=torch.int32, device=device)
    every = torch.ones(E, dtype=torch.bool, device=device)

    def fused(x, ids, weights):
        return fused_moe_w4a16(x, ids, weights, w13, w2)

    def per_expert(x, ids, weights):
        return per_expert_w4a16(x, ids, weights, w13, w2)

    def grouped(x, ids, weights):
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        return grouped_moe_fp16(x, ids, weights, gate_up16, down16, identity, every, out).half()

    return {"fused_w4a16": fused, "per_expert_w4a16": per_expert, "fp16_grouped": grouped}


def _time_ms(fn: Callable[[], object], device: torch.device, warmup: int, repeats: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()  # a benchmark: one sync per timed call
            times.append(start.elapsed_time(end))
        else:
            started = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - started))
    return statistics.median(times)


def run_kernel_bench(
    shape: KernelShape,
    tokens: Sequence[int] = (1, 2, 4, 8, 16, 32),
    *,
    device: torch.device | str = "cuda",
    warmup: int = 3,
    repeats: int = 20,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> list[KernelTiming]:
    """Validate and time the three paths of one MoE layer at each token count.

    Args:
        shape: the layer's shape.
        tokens: token counts T (each >= 1).
        device: where to run.
        warmup, repeats: untimed and timed calls per (T, path).
        seed: seed of the random weights, inputs and routing.
        progress: called with a short label before each measurement.

    Returns:
        One timing per (T, path), in that order.

    Raises:
        ValueError: a token count < 1 or ``top_k`` > ``num_experts``.
    """
    if any(t < 1 for t in tokens):
        raise ValueError(f"token counts must be >= 1, got {list(tokens)}.")
    if shape.top_k > shape.num_experts:
        raise ValueError(f"top_k={shape.top_k} exceeds num_experts={shape.num_experts}.")
    device = torch.device(device)
    g = torch.Generator(device="cpu").manual_seed(seed)
    H, E, k = shape.hidden, shape.num_experts, shape.top_k
    inter = shape.intermediate
    gate_up = (torch.randn(E, 2 * inter, H, generator=g) * 0.02).to(device, torch.float16)
    down = (torch.randn(E, H, inter, generator=g) * 0.02).to(device, torch.float16)
    w13 = quantize_int4(gate_up, shape.group_size)
    w2 = quantize_int4(down, shape.group_size)
    del gate_up, down
    paths = _make_paths(w13, w2, device)
    backend = select_backend(device)
    out: list[KernelTiming] = []
    for T in tokens:
        x = torch.randn(T, H, generator=g).to(device, torch.float16)
        ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]).to(device)
        weights = torch.rand(T, k, generator=g).softmax(-1).to(device, torch.float32)
        reference = fused_moe_w4a16_reference(x, ids, weights, w13, w2).float()
        for name in PATHS:
            if progress is not None:
                progress(f"{shape.name} T={T} {name}")
            fn = paths[name]
            got = fn(x, ids, weights).float()
            error = float((got - reference).norm() / reference.norm().clamp_min(1e-30))
            call = lambda fn=fn, x=x, ids=ids, weights=weights: fn(x, ids, weights)
            ms = _time_ms(call, device, warmup, repeats)
            out.append(KernelTiming(shape.name, T, name, ms, error, backend, str(device)))
    return out
