"""Interleaved (complex) rotary position embedding in one launch per tensor: DeepSeek-V2's.

transformers applies DeepSeek-V2's rotary embedding to the rope part of the query and the
key as a complex product: ``view_as_real(view_as_complex(x.float()) * freqs_cis).type_as(x)``,
pairs ``(x[2j], x[2j+1])`` rotated by ``freqs_cis[j]``. That is six kernels per attention
layer (two casts up, two complex products, two casts down); a DeepSeek-V2-Lite decode step
runs 27 of them. :func:`rotary_complex` does one tensor in one launch, in the same fp32
arithmetic (``(a + bi)(c + di) = (ac - bd) + (ad + bc)i``), rounded to the input's dtype.
Each element depends on its own pair and position only, so it is batch-invariant.
"""

from __future__ import annotations

import torch

from specter_kernels.backend import select_backend

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def rotary_complex_reference(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """transformers' DeepSeek-V2 expression for one tensor.

    Args:
        x: ``[B, H, S, D]``, ``D`` even.
        freqs_cis: ``[B or 1, S, D / 2]`` complex64.

    Returns:
        ``[B, H, S, D]`` contiguous, ``x``'s dtype.
    """
    pairs = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(pairs * freqs_cis.unsqueeze(1)).flatten(3).type_as(x)


def rotary_complex(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """Rotate the pairs ``(x[..., 2j], x[..., 2j+1])`` by ``freqs_cis[..., j]`` in one launch
    (Triton on CUDA, the reference elsewhere).

    Args:
        x: ``[B, H, S, D]`` fp16, bf16 or fp32, ``D`` even, any strides (e.g. the rope slice
            of a query).
        freqs_cis: ``[B or 1, S, D / 2]`` complex64 on ``x``'s device.

    Returns:
        ``[B, H, S, D]`` contiguous, ``x``'s dtype.

    Raises:
        TypeError: an unsupported dtype.
        ValueError: shapes that do not match, or tensors on different devices.
    """
    if not isinstance(x, torch.Tensor) or x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(
            f"x must be a tensor of {SUPPORTED_DTYPES}, got {getattr(x, 'dtype', type(x))}"
        )
    if not isinstance(freqs_cis, torch.Tensor) or freqs_cis.dtype != torch.complex64:
        got = getattr(freqs_cis, "dtype", type(freqs_cis))
        raise TypeError(f"freqs_cis must be a complex64 tensor, got {got}")
    if x.dim() != 4 or x.shape[-1] % 2:
        raise ValueError(f"x must be [B, H, S, D] with D even, got {tuple(x.shape)}")
    B, _, S, D = x.shape
    if (
        freqs_cis.dim() != 3
        or freqs_cis.shape[0] not in (1, B)
        or tuple(freqs_cis.shape[1:]) != (S, D // 2)
        or freqs_cis.device != x.device
    ):
        raise ValueError(
            f"freqs_cis must be [B or 1, S, D/2] = [{B} or 1, {S}, {D // 2}] on {x.device}, got "
            f"{tuple(freqs_cis.shape)} on {freqs_cis.device}"
        )
    if x.numel() == 0 or select_backend(x.device) == "torch":
        return rotary_complex_reference(x, freqs_cis)
    from specter_kernels.rotary_triton import launch_rotary_complex

    freqs = torch.view_as_real(freqs_cis)  # [B or 1, S, D/2, 2] float32
    if freqs.stride(-1) != 1 or freqs.stride(-2) != 2:
        freqs = freqs.contiguous()
    return launch_rotary_complex(x, freqs)
