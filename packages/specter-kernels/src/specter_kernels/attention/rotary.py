"""Rotary position embeddings in one launch per tensor: DeepSeek-V2's interleaved (complex)
form and Qwen2-MoE's / PhiMoE's rotate-half form.

transformers applies DeepSeek-V2's rotary embedding to the rope part of the query and the
key as a complex product: ``view_as_real(view_as_complex(x.float()) * freqs_cis).type_as(x)``,
pairs ``(x[2j], x[2j+1])`` rotated by ``freqs_cis[j]``. That is six kernels per attention
layer (two casts up, two complex products, two casts down); a DeepSeek-V2-Lite decode step
runs 27 of them. :func:`rotary_complex` does one tensor in one launch, in the same fp32
arithmetic (``(a + bi)(c + di) = (ac - bd) + (ad + bc)i``), rounded to the input's dtype.
Each element depends on its own pair and position only, so it is batch-invariant.

Qwen2-MoE and PhiMoE compute ``x * cos + rotate_half(x) * sin`` (``rotate_half`` pairs
element ``d`` with ``d +- D/2``): ten kernels per attention layer for query and key.
:func:`rotary_half` does one tensor in one launch with the same roundings as torch (each
product rounded to the result dtype, then their sum), so its bits equal transformers'.
"""

from __future__ import annotations

import torch

from specter_kernels.backend import FLOAT_DTYPES, select_backend


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
    if not isinstance(x, torch.Tensor) or x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"x must be a tensor of {FLOAT_DTYPES}, got {getattr(x, 'dtype', type(x))}")
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
    from specter_kernels.attention.rotary_triton import launch_rotary_complex

    freqs = torch.view_as_real(freqs_cis)  # [B or 1, S, D/2, 2] float32
    if freqs.stride(-1) != 1 or freqs.stride(-2) != 2:
        freqs = freqs.contiguous()
    return launch_rotary_complex(x, freqs)


def rotary_half_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """transformers' rotate-half expression for one tensor (Qwen2-MoE, PhiMoE).

    Args:
        x: ``[B, H, S, D]``, ``D`` even.
        cos, sin: ``[B or 1, S, D]``.

    Returns:
        ``[B, H, S, D]`` in the promotion of ``x``'s and ``cos``'s dtypes.
    """
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return (x * cos.unsqueeze(1)) + (rotated * sin.unsqueeze(1))


def rotary_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` in one launch (Triton on CUDA, the reference
    elsewhere), with torch's roundings.

    Args:
        x: ``[B, H, S, D]`` fp16, bf16 or fp32, ``D`` even, any strides.
        cos, sin: ``[B or 1, S, D]`` of one dtype among those, on ``x``'s device.

    Returns:
        ``[B, H, S, D]`` contiguous, in the promotion of ``x``'s and ``cos``'s dtypes.

    Raises:
        TypeError: an unsupported dtype, or ``cos`` and ``sin`` of different dtypes.
        ValueError: shapes that do not match, or tensors on different devices.
    """
    for name, tensor in (("x", x), ("cos", cos), ("sin", sin)):
        if not isinstance(tensor, torch.Tensor) or tensor.dtype not in FLOAT_DTYPES:
            got = getattr(tensor, "dtype", type(tensor))
            raise TypeError(f"{name} must be a tensor of {FLOAT_DTYPES}, got {got}")
    if cos.dtype != sin.dtype:
        raise TypeError(f"cos and sin must share a dtype, got {cos.dtype} and {sin.dtype}")
    if x.dim() != 4 or x.shape[-1] % 2:
        raise ValueError(f"x must be [B, H, S, D] with D even, got {tuple(x.shape)}")
    B, _, S, D = x.shape
    for name, tensor in (("cos", cos), ("sin", sin)):
        if (
            tensor.dim() != 3
            or tensor.shape[0] not in (1, B)
            or tuple(tensor.shape[1:]) != (S, D)
            or tensor.device != x.device
        ):
            raise ValueError(
                f"{name} must be [B or 1, S, D] = [{B} or 1, {S}, {D}] on {x.device}, got "
                f"{tuple(tensor.shape)} on {tensor.device}"
            )
    if x.numel() == 0 or select_backend(x.device) == "torch":
        return rotary_half_reference(x, cos, sin)
    from specter_kernels.attention.rotary_triton import launch_rotary_half

    out_dtype = torch.promote_types(x.dtype, cos.dtype)
    return launch_rotary_half(x, cos, sin, out_dtype)
