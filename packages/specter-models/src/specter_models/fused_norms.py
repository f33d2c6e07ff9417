"""transformers' RMSNorm modules as one fused kernel launch on CUDA.

DeepSeek-V2's and Qwen2-MoE's ``*RMSNorm`` modules compute their norm as seven or eight
kernels; a DeepSeek-V2-Lite decode step runs 82 of them, about half of its kernels, which
in a CUDA graph still cost a few microseconds each. :func:`install_fused_rms_norm` makes
each of them call specter-kernels' ``rms_norm`` (one Triton program per row, the same
arithmetic, batch-invariant by construction) for CUDA half/float inputs, and their own
forward otherwise (CPU models, float64). PhiMoE's ``nn.LayerNorm`` is one torch kernel
already and is left alone. A fused norm whose input a kernel before it normalised already
(:func:`hand_normed`) returns that result instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from specter_kernels import FLOAT_DTYPES as FUSED_DTYPES
from specter_kernels import rms_norm
from specter_models.module_patches import patch_forwards


def is_rms_norm(module: nn.Module) -> bool:
    """A transformers T5-style RMSNorm: class name ending ``RMSNorm``, a ``weight`` and a
    ``variance_epsilon``."""
    return (
        type(module).__name__.endswith("RMSNorm")
        and isinstance(getattr(module, "weight", None), torch.Tensor)
        and isinstance(getattr(module, "variance_epsilon", None), float)
    )


def fused_applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the fused kernel takes this call (CUDA, half or float tensors)."""
    return x.is_cuda and x.dtype in FUSED_DTYPES and weight.dtype in FUSED_DTYPES


PRENORMED = "_specter_prenormed"
"""The attribute a fused norm module finds ``(x, normed)`` under when a kernel before it (the
MoE join of ``shared_overlap``) normalised ``x`` for it already (see :func:`hand_normed`)."""


def hand_normed(norm: nn.Module, x: torch.Tensor, normed: torch.Tensor) -> None:
    """Leave ``normed``, ``norm``'s output for the input ``x`` computed with its bits by a
    fused kernel, for ``norm``'s next call: when that call's input is ``x`` itself (the same
    tensor object) it returns ``normed`` and launches nothing. Any call takes it away, so a
    later call on another tensor normalises that tensor."""
    norm.__dict__[PRENORMED] = (x, normed)


def install_fused_rms_norm(model: nn.Module) -> int:
    """Route every RMSNorm module of ``model`` through the fused kernel (once).

    Returns:
        How many modules were wrapped by this call.
    """
    return patch_forwards(model, is_rms_norm, "_specter_fused", _fused_forward)


def _fused_forward(module: nn.Module, plain: Callable[..., Any]) -> Callable[..., Any]:
    def forward(hidden_states: torch.Tensor) -> torch.Tensor:
        handed = module.__dict__.pop(PRENORMED, None)
        if handed is not None and handed[0] is hidden_states:
            return handed[1]  # normalised already, with this module's bits (hand_normed)
        if fused_applies(hidden_states, module.weight):
            return rms_norm(hidden_states, module.weight, module.variance_epsilon)
        return plain(hidden_states)

    return forward
