"""transformers' softmax-then-top-k routers as two fused kernel launches on CUDA.

DeepSeek-V2's ``greedy`` router casts the hidden state and its weight to fp32, multiplies,
takes a softmax and ``torch.topk`` and scales the chosen weights; Qwen2-MoE's multiplies in
the model's dtype and may renormalise the chosen weights. That is five to seven kernels per
MoE layer, about a fifth of a DeepSeek-V2-Lite decode step's launches.
:func:`install_fused_routers` makes each such router call specter-kernels' ``router_topk``
(two Triton launches, batch-invariant by construction) for CUDA inputs, with the router's
own settings, and its own forward otherwise (CPU models, float64, DeepSeek's
``group_limited_greedy``). PhiMoE's sparsemixer router is left alone.

The fused router returns transformers' triple ``(logits, weights, ids)`` with the ids
largest-probability first and ties to the lower expert id (DeepSeek's ``torch.topk`` with
``sorted=False`` promises no order at all); its sums run in another order than cuBLAS's,
so a near tie between two experts can go the other way than in transformers. The target
and the draft call the same kernel, so speculative and plain decoding still agree bit for
bit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from specter_kernels import FLOAT_DTYPES, router_topk
from specter_models.module_patches import patch_forwards


def router_settings(module: nn.Module) -> dict[str, Any] | None:
    """``router_topk`` keyword arguments reproducing ``module``, or None when the module is
    not a router the fused kernel implements.

    Keys: ``top_k``, ``logits_dtype`` (None: the input's dtype), ``renormalize``,
    ``scaling``, ``weights_dtype`` (None: the logits' dtype).
    """
    name = type(module).__name__
    if name == "DeepseekV2TopkRouter" and getattr(module, "topk_method", None) == "greedy":
        return {
            "top_k": int(module.top_k),
            "logits_dtype": torch.float32,
            "renormalize": False,
            "scaling": float(module.routed_scaling_factor),
            "weights_dtype": torch.float32,
        }
    if name == "Qwen2MoeTopKRouter":
        return {
            "top_k": int(module.top_k),
            "logits_dtype": None,
            "renormalize": bool(module.norm_topk_prob),
            "scaling": 1.0,
            "weights_dtype": None,
        }
    return None


def fused_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the fused kernel takes this call (CUDA, half or float tensors)."""
    return x.is_cuda and x.dtype in FLOAT_DTYPES and weight.dtype in FLOAT_DTYPES


def install_fused_routers(model: nn.Module) -> int:
    """Route every supported router of ``model`` through ``router_topk`` (once).

    Returns:
        How many routers were wrapped by this call.
    """
    return patch_forwards(
        model, lambda m: router_settings(m) is not None, "_specter_fused_router", _fused_forward
    )


def _fused_forward(module: nn.Module, plain: Callable[..., Any]) -> Callable[..., Any]:
    def forward(hidden_states: torch.Tensor):
        x = hidden_states.reshape(-1, module.hidden_dim)
        settings = router_settings(module)  # the module's settings at call time
        if settings is None or not fused_applies(x, module.weight):
            return plain(hidden_states)
        logits_dtype = settings["logits_dtype"] or x.dtype
        return router_topk(
            x,
            module.weight,
            settings["top_k"],
            logits_dtype=logits_dtype,
            renormalize=settings["renormalize"],
            scaling=settings["scaling"],
            weights_dtype=settings["weights_dtype"] or logits_dtype,
        )

    return forward
