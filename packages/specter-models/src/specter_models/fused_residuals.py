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
  ``residual_add``; other MLPs (DeepSeek-V2's dense first layer) keep the layer's add.

Both kernels round as torch's adds round and normalise as Specter's fused RMSNorm does, so
the layer's outputs, its cache writes and the model's logits keep their bits. The fused
forward applies where Specter's fused RMSNorm does (``fused_norms``: CUDA, half or float
tensors, the norm module patched by it) and the attention output has the residual's dtype;
elsewhere (the CPU, float64, ``fused_norms=False``, extra positional arguments) the layer
runs transformers' forward. ``SPECTER_FUSED_RESIDUALS=0`` (read at import) keeps the adds
apart in every patched layer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from specter_kernels import add_rms_norm
from specter_kernels.backend import env_switch
from specter_models.fused_norms import fused_applies, is_rms_norm
from specter_models.module_patches import patch_forwards

__all__ = ["FUSED_RESIDUALS", "TAKES_RESIDUAL", "install_fused_residuals", "is_pre_norm_layer"]

FUSED_RESIDUALS = env_switch("SPECTER_FUSED_RESIDUALS")
"""Whether patched layers fuse their adds (``SPECTER_FUSED_RESIDUALS=0`` at import keeps
them apart, for A/B runs; tests flip this constant)."""

TAKES_RESIDUAL = "_specter_takes_residual"
"""The attribute marking an MLP block whose forward takes ``residual=`` and returns
``residual + block(x)`` (``shared_overlap`` sets it)."""


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
    return patch_forwards(model, is_pre_norm_layer, "_specter_fused_residuals", _fused_forward)


def _fused_forward(layer: nn.Module, plain: Callable[..., Any]) -> Callable[..., Any]:
    def forward(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        post = layer.post_attention_layernorm
        if args or not (
            FUSED_RESIDUALS
            and getattr(post, "_specter_fused", False)
            and fused_applies(hidden_states, post.weight)
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
            return mlp(h, residual=hidden)
        return hidden + mlp(h)

    return forward
