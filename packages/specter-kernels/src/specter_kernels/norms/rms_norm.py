"""RMSNorm in one kernel launch (DeepSeek-V2's and Qwen2-MoE's, T5-style).

transformers computes ``weight * (x.float() * rsqrt(mean(x.float()^2) + eps)).to(x.dtype)``
as seven or eight kernels (casts, square, mean, add, rsqrt, two products). At batch size one
a decode step runs some eighty of these norms, so their launches (or, in a CUDA graph,
their per-kernel floor) are a large share of the step. :func:`rms_norm` fuses them into one
Triton program per row, in the same arithmetic (fp32 statistics, the normalised row
rounded to the input dtype before the weight product). Its sum of squares has a fixed
order per row, so it is also batch-invariant (the rounding of the mean differs from
torch's in the last bits; the torch reference is transformers' own expression).
"""

from __future__ import annotations

import torch

from specter_kernels.backend import FLOAT_DTYPES, select_backend


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' RMSNorm expression: ``weight * (x * rsqrt(mean(x^2) + eps)).to(x.dtype)``
    with the statistics in fp32.

    Args:
        x: ``[..., N]``.
        weight: ``[N]``.
        eps: added to the mean square.

    Returns:
        ``[..., N]`` in the promotion of ``weight``'s and ``x``'s dtypes.
    """
    input_dtype = x.dtype
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    h = h * torch.rsqrt(variance + eps)
    return weight * h.to(input_dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of the last dim in one launch (Triton on CUDA, the reference elsewhere).

    Args:
        x: ``[..., N]`` fp16, bf16 or fp32, any strides.
        weight: ``[N]`` fp16, bf16 or fp32.
        eps: added to the mean square, >= 0.

    Returns:
        ``[..., N]`` in the promotion of ``weight``'s and ``x``'s dtypes.

    Raises:
        TypeError: an unsupported dtype.
        ValueError: ``weight`` is not ``[N]`` on ``x``'s device, or ``eps`` is negative.
    """
    for name, tensor in (("x", x), ("weight", weight)):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(tensor).__name__}")
        if tensor.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name} has dtype {tensor.dtype}; rms_norm takes {FLOAT_DTYPES}")
    N = check_norm_args("rms_norm", x, weight, eps)
    if x.numel() == 0 or select_backend(x.device) == "torch":
        return rms_norm_reference(x, weight, eps)
    from specter_kernels.norms.rms_norm_triton import launch_rms_norm

    rows = x.reshape(-1, N)
    if rows.stride(1) != 1:
        rows = rows.contiguous()
    out_dtype = torch.promote_types(weight.dtype, x.dtype)
    return launch_rms_norm(rows, weight.contiguous(), float(eps), out_dtype).reshape(x.shape)


def check_norm_args(op: str, x: torch.Tensor, weight: torch.Tensor, eps: float) -> int:
    """``N``, once ``x`` is ``[..., N]``, ``weight`` is ``[N]`` on ``x``'s device and
    ``eps >= 0`` (the dtypes are checked by the caller).

    Raises:
        ValueError: naming ``op``, the shapes and devices, or the epsilon.
    """
    N = x.shape[-1] if x.dim() else 0
    if x.dim() < 1 or weight.shape != (N,) or weight.device != x.device:
        raise ValueError(
            f"{op} needs x [..., N] and weight [N] on one device, got x "
            f"{tuple(x.shape)} on {x.device} and weight {tuple(weight.shape)} on {weight.device}"
        )
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps!r}")
    return N
