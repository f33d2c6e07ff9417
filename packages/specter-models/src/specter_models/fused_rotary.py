"""DeepSeek-V2's rotary embedding as one fused kernel launch per tensor on CUDA.

transformers' DeepSeek-V2 attention calls its module-level ``apply_rotary_emb(q_pe, k_pe,
freqs_cis)``: two casts up, two complex products and two casts down, six kernels per
attention layer. :func:`install_fused_rotary` wraps each ``DeepseekV2Attention`` module of a
model so that, for the duration of its own forward only, that name resolves to
specter-kernels' ``rotary_complex`` (one launch per tensor, the same fp32 arithmetic) for
CUDA half/float inputs, and to transformers' function otherwise. Other models in the
process (a transformers baseline beside ours) keep transformers' function: the module
attribute is swapped in and restored around each call. Qwen2-MoE and PhiMoE use a
rotate-half rotary and are left alone.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch
from torch import nn

from specter_kernels import rotary_complex

FUSED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
ATTENTION_CLASSES = ("DeepseekV2Attention",)


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


def install_fused_rotary(model: nn.Module) -> int:
    """Route every DeepSeek-V2 attention module's rotary embedding through the fused kernel.

    Returns:
        How many modules were wrapped by this call (0 for other architectures, or when
        already installed).
    """
    count = 0
    for module in model.modules():
        if type(module).__name__ in ATTENTION_CLASSES and not getattr(
            module, "_specter_fused_rotary", False
        ):
            namespace = sys.modules[type(module).__module__]
            module.forward = _with_fused_rotary(namespace, module.forward)
            module._specter_fused_rotary = True
            count += 1
    return count


def _with_fused_rotary(namespace: ModuleType, plain: Callable[..., Any]) -> Callable[..., Any]:
    original = namespace.apply_rotary_emb

    def fused(
        xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if rotary_applies(xq, xk, freqs_cis):
            return rotary_complex(xq, freqs_cis), rotary_complex(xk, freqs_cis)
        return original(xq, xk, freqs_cis)

    def forward(*args: Any, **kwargs: Any) -> Any:
        namespace.apply_rotary_emb = fused
        try:
            return plain(*args, **kwargs)
        finally:
            namespace.apply_rotary_emb = original

    return forward
