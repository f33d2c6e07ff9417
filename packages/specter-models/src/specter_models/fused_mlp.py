"""transformers' dense and shared-expert MLPs as one gate_up GEMM and one ``silu_and_mul``.

``DeepseekV2MLP`` (DeepSeek-V2's first dense layer and every MoE layer's shared experts) and
``Qwen2MoeMLP`` (Qwen2-MoE's shared expert, and its dense layers if any) compute
``down_proj(silu(gate_proj(x)) * up_proj(x))``: two GEMMs and two elementwise kernels before
the down GEMM. At one row each launch costs a few microseconds on an H200.
:func:`install_fused_gate_up` concatenates each such module's gate and up weights into one
``[2I, H]`` tensor (gate rows first) and makes the module run one GEMM over it, then
specter-kernels' ``silu_and_mul`` (one launch, torch's bits), then its ``down_proj``:

    x [..., H] -> gate_up GEMM -> [..., 2I] -> silu_and_mul -> [..., I] -> down_proj -> [..., H]

``gate_proj.weight`` and ``up_proj.weight`` become views of the two halves of that tensor, so
no weight is held twice and ``state_dict``/``named_parameters`` keep their names and values.
The GEMM is batch-invariant exactly when the model's other linears are
(``invariant_scopes``): ``invariant_linear`` while ``ExpertsRuntime.invariant_linears_active``,
``F.linear`` otherwise. ``silu_and_mul`` is elementwise, so invariant anyway, and
``down_proj`` is the module's own (already wrapped) ``nn.Linear``.

Install it once the weights are loaded (the copy needs them) and before CUDA graphs are
captured (a captured graph keeps reading the old gate and up weights, which the install
frees). Moving the model to another device or dtype afterwards would move the parameter views
but not the concatenated tensor the forward reads: install after the last move.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from specter_kernels import FLOAT_DTYPES, silu_and_mul, silu_and_mul_reference
from specter_models.experts_runtime import ExpertsRuntime
from specter_models.invariant_scopes import runtime_linear
from specter_models.module_patches import concatenate_linear_weights, patch_forwards

FUSED_MLP_CLASSES = ("DeepseekV2MLP", "Qwen2MoeMLP")
"""Class names of the SwiGLU MLP modules that are fused."""
SILU_CLASSES = ("SiLU", "SiLUActivation")
"""Class names of the activations taken for silu (torch's and transformers' ``ACT2FN``)."""


def is_fusable_mlp(module: nn.Module) -> bool:
    """Whether ``module`` is a transformers SwiGLU MLP this module can fuse.

    That is: class named ``DeepseekV2MLP`` or ``Qwen2MoeMLP``; ``gate_proj``, ``up_proj``
    and ``down_proj`` bias-free ``nn.Linear`` with gate and up weights alike (``[I, H]``, one
    dtype and device) and ``down_proj`` taking ``I``; ``act_fn`` a SiLU; and
    ``config.hidden_act == "silu"`` where the module has a config.
    """
    if type(module).__name__ not in FUSED_MLP_CLASSES:
        return False
    projections = [getattr(module, name, None) for name in ("gate_proj", "up_proj", "down_proj")]
    if not all(isinstance(p, nn.Linear) and p.bias is None for p in projections):
        return False
    gate, up, down = (p.weight for p in projections)
    if (gate.shape, gate.dtype, gate.device) != (up.shape, up.dtype, up.device):
        return False
    if down.shape[1] != gate.shape[0]:
        return False
    config = getattr(module, "config", None)
    if config is not None and getattr(config, "hidden_act", None) != "silu":
        return False
    return type(getattr(module, "act_fn", None)).__name__ in SILU_CLASSES


def install_fused_gate_up(model: nn.Module, runtime: ExpertsRuntime) -> int:
    """Fuse the gate and up projections of every SwiGLU MLP of ``model`` (once; see the module
    docstring).

    Args:
        model: transformers' model, its weights loaded.
        runtime: the shared runtime whose ``invariant_linears_active`` picks the GEMM.

    Returns:
        How many modules were fused by this call (0 when they all were already).

    Raises:
        ValueError: a fusable module's weights are still on the meta device (not loaded).
    """

    def make_forward(module: nn.Module, _plain: Callable) -> Callable[[torch.Tensor], torch.Tensor]:
        gate_up = concatenate_linear_weights(
            module, ("gate_proj", "up_proj"), "install_fused_gate_up"
        )
        module._specter_gate_up = gate_up  # a plain attribute: not in state_dict
        return _fused_forward(module, runtime, gate_up)

    return patch_forwards(model, is_fusable_mlp, "_specter_fused_gate_up", make_forward)


def _fused_forward(
    module: nn.Module, runtime: ExpertsRuntime, gate_up: torch.Tensor
) -> Callable[[torch.Tensor], torch.Tensor]:
    def forward(x: torch.Tensor) -> torch.Tensor:
        h = runtime_linear(runtime, x, gate_up)  # [..., 2I], invariant as the other linears
        h = silu_and_mul(h) if h.dtype in FLOAT_DTYPES else silu_and_mul_reference(h)
        return module.down_proj(h)  # [..., H]

    return forward
