"""Rotary embeddings as one fused kernel launch per tensor on CUDA.

transformers' attention modules call a module-level function for their rotary embedding:
DeepSeek-V2's ``apply_rotary_emb(q_pe, k_pe, freqs_cis)`` (casts and complex products, six
kernels per layer) and Qwen2-MoE's and PhiMoE's ``apply_rotary_pos_emb(q, k, cos, sin)``
(``x * cos + rotate_half(x) * sin``, ten kernels per layer). :func:`install_fused_rotary`
wraps each such attention module of a model so that, for the duration of its own forward
only, that name resolves to specter-kernels' ``rotary_complex`` / ``rotary_half`` (one
launch per tensor; the complex one in the same fp32 arithmetic, the rotate-half one with
torch's roundings, so the same bits) for CUDA inputs, and to transformers' function
otherwise. Other models in the process (a transformers baseline beside ours) keep
transformers' function: the module attribute is swapped in and restored around each call.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch
from torch import nn

from specter_kernels import FLOAT_DTYPES as FUSED_DTYPES
from specter_kernels import rotary_complex, rotary_half
from specter_models.module_patches import patch_forwards


def rotary_applies(xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor) -> bool:
    """Whether the fused kernel takes this call: CUDA tensors of a supported dtype, complex64
    frequencies of the shape ``rotary_complex`` expects for both tensors."""
    if not (xq.is_cuda and xq.dtype in FUSED_DTYPES and xk.dtype in FUSED_DTYPES):
        return False
    if freqs_cis.dtype != torch.complex64 or freqs_cis.dim() != 3 or freqs_cis.device != xq.device:
        return False
    for x in (xq, xk):
        if x.dim() != 4 or x.shape[-1] % 2 or x.device != xq.device:
            return False
        if freqs_cis.shape[0] not in (1, x.shape[0]):
            return False
        if tuple(freqs_cis.shape[1:]) != (x.shape[2], x.shape[3] // 2):
            return False
    return True


def rotary_half_applies(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, unsqueeze_dim: int
) -> bool:
    """Whether the fused rotate-half kernel takes this call: CUDA tensors of supported
    dtypes, ``[B, H, S, D]`` heads and ``[B or 1, S, D]`` tables (``unsqueeze_dim=1``)."""
    if unsqueeze_dim != 1 or not q.is_cuda or cos.dtype != sin.dtype:
        return False
    tensors = (q, k, cos, sin)
    if any(t.dtype not in FUSED_DTYPES or t.device != q.device for t in tensors):
        return False
    if cos.dim() != 3 or cos.shape != sin.shape:
        return False
    for x in (q, k):
        if x.dim() != 4 or x.shape[-1] % 2 or cos.shape[0] not in (1, x.shape[0]):
            return False
        if tuple(cos.shape[1:]) != (x.shape[2], x.shape[3]):
            return False
    return True


def _fused_complex(original: Callable[..., Any]) -> Callable[..., Any]:
    def apply_rotary_emb(
        xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if rotary_applies(xq, xk, freqs_cis):
            return rotary_complex(xq, freqs_cis), rotary_complex(xk, freqs_cis)
        return original(xq, xk, freqs_cis)

    return apply_rotary_emb


def _fused_half(original: Callable[..., Any]) -> Callable[..., Any]:
    def apply_rotary_pos_emb(
        q: torch.Tensor,
        k: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        unsqueeze_dim: int = 1,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if rotary_half_applies(q, k, cos, sin, unsqueeze_dim):
            return rotary_half(q, cos, sin), rotary_half(k, cos, sin)
        return original(q, k, cos, sin, unsqueeze_dim)

    return apply_rotary_pos_emb


ATTENTION_CLASSES: dict[str, tuple[str, Callable[[Callable[..., Any]], Callable[..., Any]]]] = {
    "DeepseekV2Attention": ("apply_rotary_emb", _fused_complex),
    "Qwen2MoeAttention": ("apply_rotary_pos_emb", _fused_half),
    "PhimoeAttention": ("apply_rotary_pos_emb", _fused_half),
}
"""Attention class name -> (the module-level function it calls, the fused replacement's
factory, given transformers' function to fall back on)."""


def install_fused_rotary(model: nn.Module) -> int:
    """Route every supported attention module's rotary embedding through a fused kernel.

    Returns:
        How many modules were wrapped by this call (0 when already installed).
    """

    def make_forward(module: nn.Module, plain: Callable[..., Any]) -> Callable[..., Any]:
        name, factory = ATTENTION_CLASSES[type(module).__name__]
        return _swapped_during(sys.modules[type(module).__module__], name, factory, plain)

    return patch_forwards(
        model,
        lambda m: type(m).__name__ in ATTENTION_CLASSES,
        "_specter_fused_rotary",
        make_forward,
    )


def _swapped_during(
    namespace: ModuleType,
    name: str,
    factory: Callable[[Callable[..., Any]], Callable[..., Any]],
    plain: Callable[..., Any],
) -> Callable[..., Any]:
    original = getattr(namespace, name)
    fused = factory(original)

    def forward(*args: Any, **kwargs: Any) -> Any:
        setattr(namespace, name, fused)
        try:
            return plain(*args, **kwargs)
        finally:
            setattr(namespace, name, original)

    return forward
