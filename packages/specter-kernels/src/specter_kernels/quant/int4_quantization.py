"""Symmetric round-to-nearest INT4 group quantization, packing and dequantization.

Quantization is GPTQ's symmetric RTN: per group of G consecutive inputs of one
output, ``scale = max|w| / 7.5`` (so the grid ``(q - 8) * scale`` with
``q in [0, 15]`` spans ``[-8, 7] * scale`` and the largest magnitude rounds to
within half a step), ``q = clamp(round(w / scale) + 8, 0, 15)``. The error of
every element is at most ``scale / 2`` plus fp16 rounding (see the tests).
"""

from __future__ import annotations

import torch

from specter_kernels.quant.int4_weight import PACK_FACTOR, SYMMETRIC_ZERO_POINT, Int4Weight

SUPPORTED_GROUP_SIZES = (32, 64, 128)
_QMAX = 15
_SYMMETRIC_HALF_RANGE = 7.5  # (qmax + 1) / 2: the largest |w| maps to +-7.5 steps


def pack_int4(values: torch.Tensor) -> torch.Tensor:
    """Pack 4-bit values along dim -2 into int32 words (GPTQ's qweight packing).

    Args:
        values: integer tensor ``[..., K, N]`` with entries in 0..15, K a multiple of 8.

    Returns:
        int32 ``[..., K // 8, N]``; value ``8 * r + j`` lands in bits ``4j .. 4j + 3``
        of word r.

    Raises:
        ValueError: K is not a multiple of 8.
    """
    K = values.shape[-2]
    if K % PACK_FACTOR:
        raise ValueError(f"pack_int4 needs the packed dim to be a multiple of 8, got {K}")
    v = values.to(torch.int64).reshape(*values.shape[:-2], K // PACK_FACTOR, PACK_FACTOR, -1)
    shifts = (4 * torch.arange(PACK_FACTOR, device=values.device)).view(PACK_FACTOR, 1)
    words = (v << shifts).sum(dim=-2)
    # Words above 2**31 - 1 wrap to negative int32, as in GPTQ checkpoints.
    words = torch.where(words >= 2**31, words - 2**32, words)
    return words.to(torch.int32)


def unpack_int4(qweight: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_int4`.

    Args:
        qweight: int32 ``[..., K // 8, N]``.

    Returns:
        uint8 ``[..., K, N]`` with values 0..15.
    """
    shifts = (4 * torch.arange(PACK_FACTOR, device=qweight.device, dtype=torch.int32)).view(
        PACK_FACTOR, 1
    )
    nibbles = (qweight.unsqueeze(-2) >> shifts) & 0xF  # [..., K/8, 8, N]
    return nibbles.reshape(*qweight.shape[:-2], -1, qweight.shape[-1]).to(torch.uint8)


def quantize_int4(w: torch.Tensor, group_size: int = 128) -> Int4Weight:
    """Quantize stacked expert weights to symmetric INT4 (RTN) in the GPTQ layout.

    Args:
        w: float weights ``[E, N, K]`` (stacked experts, transformers' layout) or
            ``[N, K]`` (one linear; returned with E = 1).
        group_size: inputs per scale: 32, 64 or 128.

    Returns:
        An Int4Weight with ``zeros=None`` (zero point 8) on w's device.

    Raises:
        TypeError: w is not a floating-point tensor.
        ValueError: bad rank, unsupported group size, K not a multiple of 8 or
            of group_size, or a scale that does not fit fp16 (non-finite weights).
    """
    if not w.is_floating_point():
        raise TypeError(f"quantize_int4 expects a floating-point weight, got {w.dtype}")
    if w.dim() == 2:
        w = w.unsqueeze(0)
    if w.dim() != 3:
        raise ValueError(f"quantize_int4 expects w [E, N, K] or [N, K], got {tuple(w.shape)}")
    if group_size not in SUPPORTED_GROUP_SIZES:
        raise ValueError(f"group_size must be one of {SUPPORTED_GROUP_SIZES}, got {group_size}")
    E, N, K = w.shape
    if K % PACK_FACTOR:
        raise ValueError(f"in_features K={K} must be a multiple of 8 to pack 4-bit values")
    if K % group_size:
        raise ValueError(
            f"in_features K={K} is not a multiple of group_size={group_size}; pick a group "
            f"size from {SUPPORTED_GROUP_SIZES} that divides K"
        )
    groups = w.float().reshape(E, N, K // group_size, group_size)
    amax = groups.abs().amax(dim=-1)  # [E, N, K/G]
    scale = torch.where(amax > 0, amax / _SYMMETRIC_HALF_RANGE, torch.ones_like(amax))
    scale16 = scale.to(torch.float16)
    if not bool(torch.isfinite(scale16).all()):  # one-time host sync, not a hot path
        raise ValueError(
            "quantize_int4: a group scale is not finite in fp16 (weights non-finite or "
            f"|w| > {65504 * _SYMMETRIC_HALF_RANGE:.0f}); clean the weights first"
        )
    # Round with the fp16 scale the kernels will use, so the bound holds for it.
    q = torch.round(groups / scale16.float().unsqueeze(-1)) + SYMMETRIC_ZERO_POINT
    q = q.clamp_(0, _QMAX).to(torch.uint8).reshape(E, N, K)
    return Int4Weight(
        qweight=pack_int4(q.transpose(1, 2)).contiguous(),
        scales=scale16.transpose(1, 2).contiguous(),
        zeros=None,
        group_size=group_size,
    )


def dequantize_int4(q: Int4Weight, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """Expand INT4 weights back to floats in transformers' ``[E, N, K]`` layout.

    Each value is ``(q - zero) * scale`` rounded to fp16, exactly what the Triton
    kernels compute in registers, then cast to ``dtype``.

    Args:
        q: the INT4 weight.
        dtype: output dtype.

    Returns:
        ``[E, N, K]`` tensor of ``dtype`` on q's device.
    """
    nibbles = unpack_int4(q.qweight).to(torch.int16)  # [E, K, N]
    if q.zeros is None:
        centred = nibbles - SYMMETRIC_ZERO_POINT
    else:
        centred = nibbles - q.zeros.to(torch.int16).repeat_interleave(q.group_size, dim=1)
    scales = q.scales.repeat_interleave(q.group_size, dim=1)
    values = centred.to(torch.float16) * scales  # one fp16 rounding, as in the kernels
    return values.transpose(1, 2).to(dtype).contiguous()
