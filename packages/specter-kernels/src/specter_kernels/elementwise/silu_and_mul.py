"""SwiGLU's activation in one launch: ``silu(gate) * up`` of a concatenated projection.

transformers' dense and shared-expert MLPs (``DeepseekV2MLP``, ``Qwen2MoeMLP``) compute
``down_proj(silu(gate_proj(x)) * up_proj(x))``: two GEMMs and two elementwise kernels
before the down GEMM. With the gate and up weights concatenated into one ``[2I, H]`` weight
(gate rows first) the two GEMMs are one, and :func:`silu_and_mul` turns its ``[..., 2I]``
result into the ``[..., I]`` input of the down projection in one more launch.

Its bits are torch's: silu in fp32 rounded to the input's dtype, then the product in fp32
rounded to the dtype, with CUDA's ``expf`` and IEEE division (see ``silu_and_mul_triton``).
Each output element depends on its own two inputs only, so it is batch-invariant.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specter_kernels.backend import FLOAT_DTYPES, select_backend


def silu_and_mul_reference(x: torch.Tensor) -> torch.Tensor:
    """torch's expression: ``F.silu(x[..., :I]) * x[..., I:]``.

    Args:
        x: ``[..., 2I]``, gate half first.

    Returns:
        ``[..., I]`` in ``x``'s dtype.
    """
    half = x.shape[-1] // 2
    return F.silu(x[..., :half]) * x[..., half:]


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of ``x = cat([gate, up], -1)`` in one launch (Triton on CUDA, the
    reference elsewhere).

    Args:
        x: ``[..., 2I]`` fp16, bf16 or fp32, gate half first, any strides.

    Returns:
        ``[..., I]`` contiguous, ``x``'s dtype, the bits of :func:`silu_and_mul_reference` on
        the same device.

    Raises:
        TypeError: ``x`` is not a tensor, or has an unsupported dtype.
        ValueError: ``x`` has no dims, or an odd last dim.

    Example:
        >>> import torch, specter_kernels as sk
        >>> gate_up = torch.randn(5, 2 * 48)  # the output of a [2I, H] gate_up GEMM
        >>> sk.silu_and_mul(gate_up).shape
        torch.Size([5, 48])
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"x has dtype {x.dtype}; silu_and_mul takes {FLOAT_DTYPES} "
            "(use silu_and_mul_reference for others)"
        )
    if x.dim() < 1 or x.shape[-1] % 2:
        raise ValueError(
            f"x must be [..., 2I] (gate and up halves) with an even last dim, got shape "
            f"{tuple(x.shape)}"
        )
    if x.numel() == 0 or select_backend(x.device) == "torch":
        return silu_and_mul_reference(x)
    from specter_kernels.elementwise.silu_and_mul_triton import launch_silu_and_mul

    rows = x.reshape(-1, x.shape[-1])
    if rows.stride(1) != 1:
        rows = rows.contiguous()
    return launch_silu_and_mul(rows).reshape(*x.shape[:-1], x.shape[-1] // 2)
