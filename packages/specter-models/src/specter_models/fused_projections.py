"""DeepSeek-V2's query and compressed-KV projections as one GEMM.

In the absorbed MLA form (``absorbed_mla``) every attention layer starts with two
projections of the same normed hidden state: ``q_proj`` (``[H * (nope + rope), hidden]``,
3072 x 2048 on DeepSeek-V2-Lite) and ``kv_a_proj_with_mqa`` (``[R + rope, hidden]``,
576 x 2048). At one row each is a GEMV of its own launch, and the narrow one cannot spread
its 2.4 MB over the GPU's SMs. :func:`install_fused_q_kv_a` concatenates the two weights into
one ``[H * (nope + rope) + R + rope, hidden]`` tensor (query rows first), makes
``q_proj.weight`` and ``kv_a_proj_with_mqa.weight`` views of its two parts (no weight held
twice; ``state_dict`` keeps its names and values) and gives the module a projection that the
absorbed forward runs instead of the two::

    x [1, T, hidden] -> one GEMM -> [1, T, H * (nope + rope) + R + rope] -> split -> q, c_kv

The GEMM is batch-invariant exactly when the model's other linears are
(``invariant_scopes.runtime_linear``). Its bits are those of one GEMM over the fused width,
not of the two (the tile of the invariant GEMM depends on N): draft and target both run it,
so speculation stays exact.

Only modules without a query LoRA (``q_lora_rank is None``, as in DeepSeek-V2-Lite) and with
bias-free projections of one dtype and device are fused. Install once the weights are loaded
and before CUDA graphs are captured, after the last move of the model (as ``fused_mlp``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from specter_models.absorbed_mla import FUSED_Q_KV_A, is_mla_attention
from specter_models.experts_runtime import ExpertsRuntime
from specter_models.invariant_scopes import runtime_linear
from specter_models.module_patches import concatenate_linear_weights

FUSED_ATTRIBUTE = FUSED_Q_KV_A
"""The attribute holding a fused module's projection (``x -> [q | c_kv]``)."""
PROJECTIONS = ("q_proj", "kv_a_proj_with_mqa")
"""The fused linears, in the order of their rows in the fused weight."""


def is_fusable_attention(module: nn.Module) -> bool:
    """Whether ``module`` is a DeepSeek-V2 MLA attention whose two input projections can be
    one GEMM: no query LoRA, ``q_proj`` and ``kv_a_proj_with_mqa`` bias-free ``nn.Linear``
    of one input width, dtype and device."""
    if not is_mla_attention(module) or getattr(module, "q_lora_rank", 0) is not None:
        return False
    q, kv = getattr(module, "q_proj", None), getattr(module, "kv_a_proj_with_mqa", None)
    if not all(isinstance(p, nn.Linear) and p.bias is None for p in (q, kv)):
        return False
    a, b = q.weight, kv.weight
    return (a.shape[1], a.dtype, a.device) == (b.shape[1], b.dtype, b.device)


def install_fused_q_kv_a(model: nn.Module, runtime: ExpertsRuntime) -> int:
    """Fuse the two input projections of every fusable attention module of ``model`` (once;
    see the module docstring).

    Args:
        model: transformers' model, its weights loaded.
        runtime: the shared runtime whose ``invariant_linears_active`` picks the GEMM.

    Returns:
        How many modules were fused by this call (0 when they all were already).

    Raises:
        ValueError: a fusable module's weights are still on the meta device (not loaded).
    """
    count = 0
    for module in model.modules():
        if getattr(module, FUSED_ATTRIBUTE, None) is not None or not is_fusable_attention(module):
            continue
        weight = concatenate_linear_weights(module, PROJECTIONS, "install_fused_q_kv_a")
        setattr(module, FUSED_ATTRIBUTE, _projection(runtime, weight))
        count += 1
    return count


def _projection(
    runtime: ExpertsRuntime, weight: torch.Tensor
) -> Callable[[torch.Tensor], torch.Tensor]:
    def project(x: torch.Tensor) -> torch.Tensor:
        return runtime_linear(runtime, x, weight)  # [..., Nq + Nkv]

    project.weight = weight  # type: ignore[attr-defined]  # for tests and inspection
    return project
