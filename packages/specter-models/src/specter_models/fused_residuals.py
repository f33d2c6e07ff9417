"""The residual adds of DeepSeek-V2's and Qwen2-MoE's decoder layers in the kernels beside
them, on CUDA.

transformers' pre-norm decoder layer runs, per layer::

    h = residual + self_attn(input_layernorm(residual))
    out = h + mlp(post_attention_layernorm(h))

At batch size one each add is a kernel of its own (a few kilobytes, about a microsecond
plus its gap inside a CUDA graph), and in an MoE block with shared experts the block's own
``routed + shared`` is a third. :func:`install_fused_residuals` gives every such layer a
forward that runs the same calls with two fewer launches:

* the attention's residual add and ``post_attention_layernorm`` as one
  ``add_rms_norm`` (specter-kernels);
* where the MLP is a block patched by ``shared_overlap`` (DeepSeek-V2's and Qwen2-MoE's MoE
  blocks), the block's ``routed + shared`` and the layer's residual add as one
  ``residual_add``; other MLPs (DeepSeek-V2's dense first layer) keep the layer's add;
* in that launch also the next layer's ``input_layernorm`` (the last layer's: the model's
  final norm) of the layer's output, handed to that norm (``link_next_norms`` names it):
  one launch fewer again.

Both kernels round as torch's adds round and normalise as Specter's fused RMSNorm does, so
the layer's outputs, its cache writes and the model's logits keep their bits. The fused
forward applies where Specter's fused RMSNorm does (``fused_norms``: CUDA, half or float
tensors, the norm module patched by it) and the attention output has the residual's dtype;
elsewhere (the CPU, float64, ``fused_norms=False``, extra positional arguments) the layer
runs transformers' forward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from specter_kernels import add_rms_norm
from specter_models.fused_norms import fused_applies, is_rms_norm
from specter_models.module_patches import patch_forwards

__all__ = [
    "NEXT_NORM",
    "TAKES_RESIDUAL",
    "install_fused_residuals",
    "is_pre_norm_layer",
    "link_next_norms",
]

TAKES_RESIDUAL = "_specter_takes_residual"
"""The attribute marking an MLP block whose forward takes ``residual=`` and returns
``residual + block(x)`` (``shared_overlap`` sets it)."""


NEXT_NORM = "_specter_next_norm"
"""The attribute holding ``(norm,)``: the RMSNorm a decoder layer's output goes to next (the
next layer's ``input_layernorm``, the last layer's the model's final ``norm``), which an MLP
block taking the residual may normalise for (``shared_overlap``); a tuple, so the norm is
not registered as the layer's submodule."""


def is_pre_norm_layer(module: nn.Module) -> bool:
    """A transformers decoder layer of the pre-norm form above: class name ending
    ``DecoderLayer``, an ``input_layernorm`` and a ``post_attention_layernorm`` that are
    RMSNorms, a ``self_attn`` and an ``mlp``."""
    return (
        type(module).__name__.endswith("DecoderLayer")
        and all(isinstance(getattr(module, n, None), nn.Module) for n in ("self_attn", "mlp"))
        and is_rms_norm(getattr(module, "input_layernorm", None) or nn.Identity())
        and is_rms_norm(getattr(module, "post_attention_layernorm", None) or nn.Identity())
    )


def install_fused_residuals(model: nn.Module) -> int:
    """Give every pre-norm decoder layer of ``model`` the fused forward (once; see the
    module docstring). Install it after ``fused_norms`` and ``shared_overlap``.

    Returns:
        How many layers were patched by this call.
    """
    link_next_norms(model)
    return patch_forwards(model, is_pre_norm_layer, "_specter_fused_residuals", _fused_forward)


def link_next_norms(model: nn.Module) -> int:
    """Name each pre-norm decoder layer's next norm (:data:`NEXT_NORM`): in every module
    with a ``layers`` list, the next layer's ``input_layernorm``, and for the last layer the
    module's final ``norm`` (where it is an RMSNorm).

    Returns:
        How many layers have a next norm.
    """
    linked = 0
    for module in model.modules():
        layers = getattr(module, "layers", None)
        if not isinstance(layers, nn.ModuleList) or not len(layers):
            continue
        following = [getattr(layer, "input_layernorm", None) for layer in list(layers)[1:]]
        following.append(getattr(module, "norm", None))
        for layer, norm in zip(layers, following, strict=True):
            if is_pre_norm_layer(layer) and isinstance(norm, nn.Module) and is_rms_norm(norm):
                layer.__dict__[NEXT_NORM] = (norm,)
                linked += 1
    return linked


def _fused_forward(layer: nn.Module, plain: Callable[..., Any]) -> Callable[..., Any]:
    def forward(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        post = layer.post_attention_layernorm
        if args or not (
            getattr(post, "_specter_fused", False) and fused_applies(hidden_states, post.weight)
        ):
            return plain(hidden_states, *args, **kwargs)
        residual = hidden_states
        h, _ = layer.self_attn(hidden_states=layer.input_layernorm(hidden_states), **kwargs)
        if h.dtype != residual.dtype or h.shape != residual.shape:
            hidden = residual + h
            h = post(hidden)
        else:
            hidden, h = add_rms_norm(h, residual, post.weight, post.variance_epsilon)
        mlp = layer.mlp
        if getattr(mlp, TAKES_RESIDUAL, False):
            following = layer.__dict__.get(NEXT_NORM)
            if following is not None:  # the block may normalise its output for it
                return mlp(h, residual=hidden, next_norm=following[0])
            return mlp(h, residual=hidden)
        return hidden + mlp(h)

    return forward
