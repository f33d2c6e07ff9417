"""Triton kernels of the rotary embeddings: one program per (b, h, s) row."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specter_kernels.pdl import pdl_enter, pdl_options

NUM_WARPS = 1
# The complex kernel's compile options: no contraction either, so its two products are rounded
# apart before the sum whichever kernel computes them (mla_prologue does the same rotation and
# must give the same bits; with contraction LLVM picks which product it fuses per kernel).
COMPLEX_COMPILE_OPTIONS = {"num_warps": NUM_WARPS, "enable_fp_fusion": False}
# rotate-half's compile options. No contraction: LLVM turns torch's rounded fp16 product and
# sum into one fma.rn.f16 otherwise, one rounding fewer than torch (seen on an H200, triton
# 3.6: a quarter of the outputs off by an ulp).
HALF_COMPILE_OPTIONS = {"num_warps": NUM_WARPS, "enable_fp_fusion": False}


@triton.jit
def _row_origin(x_ptr, H, S, sxb, sxh, sxs):
    """This program's (b, h, s) row: its index, and where it starts in ``x``."""
    row = tl.program_id(0).to(tl.int64)
    s = row % S
    h = (row // S) % H
    b = row // (S * H)
    return row, b, s, x_ptr + b * sxb + h * sxh + s * sxs


@triton.jit(do_not_specialize=["sxb", "sxh", "sxs", "sfb", "sfs"])
def _rotary_complex_kernel(
    x_ptr,
    f_ptr,
    out_ptr,
    H,
    S,
    HALF,
    sxb,
    sxh,
    sxs,
    sxd,
    sfb,
    sfs,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    pdl_enter(PDL)  # first: with PDL, wait for the previous kernel
    row, b, s, x_row = _row_origin(x_ptr, H, S, sxb, sxh, sxs)
    j = tl.arange(0, BLOCK)
    keep = j < HALF
    real = tl.load(x_row + (2 * j) * sxd, mask=keep, other=0.0).to(tl.float32)
    imag = tl.load(x_row + (2 * j + 1) * sxd, mask=keep, other=0.0).to(tl.float32)
    f_row = f_ptr + b * sfb + s * sfs
    cos = tl.load(f_row + 2 * j, mask=keep, other=0.0)
    sin = tl.load(f_row + 2 * j + 1, mask=keep, other=0.0)
    out_row = out_ptr + row * (2 * HALF)
    dtype = out_ptr.dtype.element_ty
    tl.store(out_row + 2 * j, (real * cos - imag * sin).to(dtype), mask=keep)
    tl.store(out_row + 2 * j + 1, (real * sin + imag * cos).to(dtype), mask=keep)


def launch_rotary_complex(x: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """``[B, H, S, D]`` rotated ``x`` (any strides); ``freqs [B or 1, S, D/2, 2]`` float32
    with unit stride in its last two dims."""
    B, H, S, D = x.shape
    out = torch.empty(B, H, S, D, dtype=x.dtype, device=x.device)
    half = D // 2
    sfb = freqs.stride(0) if freqs.shape[0] > 1 else 0
    _rotary_complex_kernel[(B * H * S,)](
        x, freqs, out, H, S, half, x.stride(0), x.stride(1), x.stride(2), x.stride(3),
        sfb, freqs.stride(1), BLOCK=triton.next_power_of_2(half), **COMPLEX_COMPILE_OPTIONS,
        **pdl_options(x.device, early_trigger=True),
    )  # fmt: skip
    return out


@triton.jit(do_not_specialize=["sxb", "sxh", "sxs", "scb", "scs", "ssb", "sss"])
def _rotary_half_kernel(
    x_ptr, cos_ptr, sin_ptr, out_ptr, H, S, HALF, sxb, sxh, sxs, sxd, scb, scs, ssb, sss,
    BLOCK: tl.constexpr,
    PDL: tl.constexpr = 0,
):  # fmt: skip
    pdl_enter(PDL)  # first: with PDL, wait for the previous kernel
    row, b, s, x_row = _row_origin(x_ptr, H, S, sxb, sxh, sxs)
    j = tl.arange(0, BLOCK)
    keep = j < HALF
    lo = tl.load(x_row + j * sxd, mask=keep, other=0.0).to(tl.float32)
    hi = tl.load(x_row + (j + HALF) * sxd, mask=keep, other=0.0).to(tl.float32)
    c_row = cos_ptr + b * scb + s * scs
    s_row = sin_ptr + b * ssb + s * sss
    cos_lo = tl.load(c_row + j, mask=keep, other=0.0).to(tl.float32)
    cos_hi = tl.load(c_row + j + HALF, mask=keep, other=0.0).to(tl.float32)
    sin_lo = tl.load(s_row + j, mask=keep, other=0.0).to(tl.float32)
    sin_hi = tl.load(s_row + j + HALF, mask=keep, other=0.0).to(tl.float32)
    dtype = out_ptr.dtype.element_ty
    # torch's order: each product rounded to the result dtype, then the sum.
    first = (lo * cos_lo).to(dtype).to(tl.float32) + (-hi * sin_lo).to(dtype).to(tl.float32)
    second = (hi * cos_hi).to(dtype).to(tl.float32) + (lo * sin_hi).to(dtype).to(tl.float32)
    out_row = out_ptr + row * (2 * HALF)
    tl.store(out_row + j, first.to(dtype), mask=keep)
    tl.store(out_row + j + HALF, second.to(dtype), mask=keep)


def launch_rotary_half(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, out_dtype: torch.dtype
) -> torch.Tensor:
    """``[B, H, S, D]`` ``x * cos + rotate_half(x) * sin`` of ``x`` (any strides);
    ``cos``, ``sin`` ``[B or 1, S, D]`` with a unit stride along ``D``."""
    B, H, S, D = x.shape
    cos = cos if cos.stride(-1) == 1 else cos.contiguous()
    sin = sin if sin.stride(-1) == 1 else sin.contiguous()
    out = torch.empty(B, H, S, D, dtype=out_dtype, device=x.device)
    half = D // 2
    _rotary_half_kernel[(B * H * S,)](
        x, cos, sin, out, H, S, half, x.stride(0), x.stride(1), x.stride(2), x.stride(3),
        cos.stride(0) if cos.shape[0] > 1 else 0, cos.stride(1),
        sin.stride(0) if sin.shape[0] > 1 else 0, sin.stride(1),
        BLOCK=triton.next_power_of_2(half), **HALF_COMPILE_OPTIONS,
        **pdl_options(x.device, early_trigger=True),
    )  # fmt: skip
    return out
