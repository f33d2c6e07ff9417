"""The draft's routed-expert layer with INT4 weights and FP16 activations (W4A16).

For each token t and each of its top-k experts e with routing weight w::

    out[t] = sum_e  w * down_e( silu(gate_e x[t]) * up_e x[t] )

with gate_e = rows [0, I) and up_e = rows [I, 2I) of gate_up_e (transformers'
stacked layout), products accumulated in fp32, the intermediate
``silu(gate) * up`` rounded to fp16 (as an fp16 model does) and the output
returned as fp16.

A pair whose expert id is -1 is skipped: it adds nothing to its token's output.

On CUDA this is two Triton launches (see ``w4a16_triton``): all routed experts
of the batch in one grid per projection, SiLU-and-mul fused into the gate_up
epilogue, routing weight and the sum over experts fused into the down epilogue.
The sum over experts uses fp32 atomics, so its order (not its precision) varies
between runs.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

from specter_kernels.backend import select_backend
from specter_kernels.moe.routed_inputs import check_routed_inputs
from specter_kernels.quant.int4_quantization import dequantize_int4
from specter_kernels.quant.int4_weight import Int4Weight

Path = Literal["auto", "gemv", "tile"]

# The tile path pays off once pairs share experts: measured on an H200
# (scripts/bench_kernels.py --sweep) it wins when routed pairs exceed the expected number
# of distinct experts by about this factor.
TILE_MIN_SHARING = 1.3


def choose_path(T: int, top_k: int, num_experts: int) -> Path:
    """``"gemv"`` or ``"tile"`` from the expected sharing of experts between tokens.

    Under uniform routing a batch of T tokens touches ``E * (1 - (1 - k/E)**T)``
    distinct experts in expectation. The gemv path reads one expert per routed pair,
    the tile path one per distinct expert (at some extra cost per byte), so the tile
    path wins once ``T * k`` exceeds that count by ``TILE_MIN_SHARING``.
    """
    if T <= 1:
        return "gemv"
    distinct = num_experts * (1.0 - (1.0 - top_k / num_experts) ** T)
    return "tile" if T * top_k >= TILE_MIN_SHARING * distinct else "gemv"


def _check_inputs(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: Int4Weight,
    w2: Int4Weight,
) -> None:
    _, H = check_routed_inputs(x, topk_ids, topk_weights)
    if not isinstance(w13, Int4Weight) or not isinstance(w2, Int4Weight):
        raise TypeError("w13 and w2 must be Int4Weight (see quantize_int4 / import_gptq)")
    if w13.in_features != H or w13.out_features % 2:
        raise ValueError(
            f"w13 must be gate_up [E, 2I, H={H}], got N={w13.out_features}, K={w13.in_features}"
        )
    I = w13.out_features // 2
    if (w2.out_features, w2.in_features) != (H, I) or w2.num_experts != w13.num_experts:
        raise ValueError(
            f"w2 must be down [E={w13.num_experts}, H={H}, I={I}], got "
            f"[{w2.num_experts}, {w2.out_features}, {w2.in_features}]"
        )
    for name, tensor in (("topk_ids", topk_ids), ("topk_weights", topk_weights)):
        if tensor.device != x.device:
            raise ValueError(f"{name} is on {tensor.device} but x is on {x.device}")
    for name, w in (("w13", w13), ("w2", w2)):
        if w.device != x.device:
            raise ValueError(f"{name} is on {w.device} but x is on {x.device}")


def fused_moe_w4a16(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: Int4Weight,
    w2: Int4Weight,
    *,
    path: Path = "auto",
) -> torch.Tensor:
    """Routed experts with INT4 weights: ``sum_e w_e * down_e(silu(gate_e x) * up_e x)``.

    No host synchronisation: grids are sized from T, k and E.

    Args:
        x: fp16 ``[T, H]`` hidden states.
        topk_ids: int ``[T, k]`` expert of each (token, slot), each in ``[0, E)``, or
            ``-1``: a skipped pair, which adds nothing (a draft whose pinned experts are
            computed elsewhere, see specter-models). Not checked on the device: an id
            ``>= E`` reads out of bounds.
        topk_weights: float ``[T, k]`` routing weights.
        w13: gate_up ``[E, 2I, H]`` (gate rows first).
        w2: down ``[E, H, I]``.
        path: ``"gemv"`` (one program per routed pair, for decode), ``"tile"``
            (pairs sorted by expert, tensor cores, for prefill) or ``"auto"``.
            Ignored by the torch backend.

    Returns:
        fp16 ``[T, H]``.

    Raises:
        TypeError, ValueError: bad dtypes, shapes or devices.
    """
    _check_inputs(x, topk_ids, topk_weights, w13, w2)
    if path not in ("auto", "gemv", "tile"):
        raise ValueError(f"path must be 'auto', 'gemv' or 'tile', got {path!r}")
    if x.shape[0] == 0:
        return torch.empty_like(x)
    if select_backend(x.device) == "torch":
        return fused_moe_w4a16_reference(x, topk_ids, topk_weights, w13, w2)
    from specter_kernels.moe import w4a16_configs, w4a16_triton

    T, k = topk_ids.shape
    H, I = x.shape[1], w2.in_features
    if path == "auto":
        path = choose_path(T, k, w13.num_experts)
    if path == "gemv":
        gate_up, down = w4a16_configs.gemv_configs(x.device, T, k, H, I)
        return w4a16_triton.launch_gemv(x, topk_ids, topk_weights, w13, w2, gate_up, down)
    gate_up, down = w4a16_configs.tile_configs(x.device, T, k, w13.num_experts, H, I)
    return w4a16_triton.launch_tile(x, topk_ids, topk_weights, w13, w2, gate_up, down)


def fused_moe_w4a16_reference(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: Int4Weight,
    w2: Int4Weight,
) -> torch.Tensor:
    """Plain torch reference of :func:`fused_moe_w4a16` (loops over experts; syncs)."""
    _check_inputs(x, topk_ids, topk_weights, w13, w2)
    T, H = x.shape
    I = w2.in_features
    out = torch.zeros(T, H, dtype=torch.float32, device=x.device)
    used = torch.unique(topk_ids)
    used = used[used >= 0]  # -1: skipped pairs
    if used.numel() == 0:
        return out.half()
    gate_up = dequantize_int4(w13.experts(used), torch.float32)
    down = dequantize_int4(w2.experts(used), torch.float32)
    for i, expert in enumerate(used.tolist()):
        tokens, slots = torch.nonzero(topk_ids == expert, as_tuple=True)
        projected = x[tokens].float() @ gate_up[i].T
        h = (F.silu(projected[:, :I]) * projected[:, I:]).half().float()
        y = (h @ down[i].T) * topk_weights[tokens, slots].float().unsqueeze(1)
        out.index_add_(0, tokens, y)
    return out.half()
