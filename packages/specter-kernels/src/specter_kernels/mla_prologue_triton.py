"""Triton kernel of :func:`specter_kernels.mla_prologue`: one program per token.

Each program normalises its latent row as ``_rms_norm_kernel`` does (the same lanes, warps
and tree, so the same bits), rotates its key's and every head's query rope pairs as
``_rotary_complex_kernel`` does, and stores the latent and the key at the token's cache row.
Compiled without floating-point contraction, as the rotary kernel is, so each product is
rounded apart in both.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specter_kernels.pdl import pdl_enter, pdl_options
from specter_kernels.rms_norm_triton import NUM_WARPS


@triton.jit(
    do_not_specialize=["start", "sq_t", "sq_h", "sq_d", "skv_t", "skp_t", "sf_t", "s_lat", "s_rope"]
)
def _mla_prologue_kernel(
    q_ptr, kv_ptr, kp_ptr, w_ptr, f_ptr, lat_ptr, rope_ptr, out_ptr, pos_ptr,
    start, T, H, R, HALF,
    sq_t, sq_h, sq_d, skv_t, skp_t, sf_t, s_lat, s_rope,
    eps,
    BLOCK_R: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_H: tl.constexpr,
    HAS_POSITIONS: tl.constexpr, PDL: tl.constexpr = 0,
):  # fmt: skip
    pdl_enter(PDL)  # first: with PDL, wait for the previous kernel
    t = tl.program_id(0).to(tl.int64)
    if HAS_POSITIONS:
        row = tl.load(pos_ptr + t)
    else:
        row = start + t
    # The latent's RMSNorm: _rms_norm_kernel's arithmetic for one BLOCK_R block.
    offs = tl.arange(0, BLOCK_R)
    keep = offs < R
    kv_row = kv_ptr + t * skv_t
    acc = tl.zeros([BLOCK_R], dtype=tl.float32)
    x = tl.load(kv_row + offs, mask=keep, other=0.0).to(tl.float32)
    acc += x * x
    inv = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / R + eps)
    x = tl.load(kv_row + offs, mask=keep, other=0.0).to(tl.float32)
    normed = (x * inv).to(kv_ptr.dtype.element_ty)
    w = tl.load(w_ptr + offs, mask=keep, other=0.0).to(tl.float32)
    latent = w * normed.to(tl.float32)
    tl.store(lat_ptr + row * s_lat + offs, latent.to(lat_ptr.dtype.element_ty), mask=keep)
    # The rotations: (real, imag) * (cos, sin) in fp32, one rounding.
    j = tl.arange(0, BLOCK_HALF)
    jk = j < HALF
    f_row = f_ptr + t * sf_t
    cos = tl.load(f_row + 2 * j, mask=jk, other=0.0)
    sin = tl.load(f_row + 2 * j + 1, mask=jk, other=0.0)
    kp_row = kp_ptr + t * skp_t
    real = tl.load(kp_row + 2 * j, mask=jk, other=0.0).to(tl.float32)
    imag = tl.load(kp_row + 2 * j + 1, mask=jk, other=0.0).to(tl.float32)
    key = rope_ptr + row * s_rope
    dtype = rope_ptr.dtype.element_ty
    tl.store(key + 2 * j, (real * cos - imag * sin).to(dtype), mask=jk)
    tl.store(key + 2 * j + 1, (real * sin + imag * cos).to(dtype), mask=jk)
    h = tl.arange(0, BLOCK_H)
    qk = (h < H)[:, None] & jk[None, :]
    q_row = q_ptr + t * sq_t + h[:, None].to(tl.int64) * sq_h
    real = tl.load(q_row + (2 * j[None, :]) * sq_d, mask=qk, other=0.0).to(tl.float32)
    imag = tl.load(q_row + (2 * j[None, :] + 1) * sq_d, mask=qk, other=0.0).to(tl.float32)
    # out [H, T, 2 * HALF] contiguous
    out = out_ptr + (h[:, None].to(tl.int64) * T + t) * (2 * HALF)
    dtype = out_ptr.dtype.element_ty
    tl.store(out + 2 * j[None, :], (real * cos[None, :] - imag * sin[None, :]).to(dtype), mask=qk)
    tl.store(
        out + 2 * j[None, :] + 1, (real * sin[None, :] + imag * cos[None, :]).to(dtype), mask=qk
    )


def launch_mla_prologue(
    q_pe: torch.Tensor,
    kv_nope: torch.Tensor,
    k_pe: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    freqs: torch.Tensor,
    latent_cache: torch.Tensor,
    rope_cache: torch.Tensor,
    rows: int | torch.Tensor,
) -> torch.Tensor:
    """Run the kernel on validated inputs (``freqs [T, rope/2, 2]`` float32, unit strides in
    its last two dims); returns the rotated queries ``[H, T, rope]``."""
    T, H, rope = q_pe.shape
    R = kv_nope.shape[1]
    out = torch.empty(H, T, rope, dtype=q_pe.dtype, device=q_pe.device)
    positions = isinstance(rows, torch.Tensor)
    _mla_prologue_kernel[(T,)](
        q_pe, kv_nope, k_pe, weight, freqs, latent_cache, rope_cache, out,
        rows if positions else out, 0 if positions else rows, T, H, R, rope // 2,
        q_pe.stride(0), q_pe.stride(1), q_pe.stride(2), kv_nope.stride(0), k_pe.stride(0),
        freqs.stride(0), latent_cache.stride(0), rope_cache.stride(0), eps,
        BLOCK_R=triton.next_power_of_2(R),  # R <= MAX_LATENT: rms_norm's one block
        BLOCK_HALF=triton.next_power_of_2(rope // 2), BLOCK_H=triton.next_power_of_2(H),
        HAS_POSITIONS=positions, num_warps=NUM_WARPS, enable_fp_fusion=False,
        **pdl_options(q_pe.device, early_trigger=True),
    )  # fmt: skip
    return out
