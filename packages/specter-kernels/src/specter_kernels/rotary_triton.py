"""Triton kernel of the interleaved rotary embedding: one program per (b, h, s) row."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

NUM_WARPS = 1


@triton.jit(do_not_specialize=["sxb", "sxh", "sxs", "sfb", "sfs"])
def _rotary_complex_kernel(
    x_ptr, f_ptr, out_ptr, H, S, HALF, sxb, sxh, sxs, sxd, sfb, sfs, BLOCK: tl.constexpr
):
    row = tl.program_id(0).to(tl.int64)
    s = row % S
    h = (row // S) % H
    b = row // (S * H)
    j = tl.arange(0, BLOCK)
    keep = j < HALF
    x_row = x_ptr + b * sxb + h * sxh + s * sxs
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
        sfb, freqs.stride(1), BLOCK=triton.next_power_of_2(half), num_warps=NUM_WARPS,
    )  # fmt: skip
    return out
