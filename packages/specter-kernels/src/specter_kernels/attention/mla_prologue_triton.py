"""Triton kernel of :func:`specter_kernels.mla_prologue`: one program per token (and, for
:func:`specter_kernels.mla_prologue_absorb`, the query absorption's programs after them).

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

from specter_kernels.norms.rms_norm_triton import NUM_WARPS
from specter_kernels.pdl import pdl_enter, pdl_options


@triton.jit
def _prologue_token(
    t, q_ptr, kv_ptr, kp_ptr, w_ptr, f_ptr, lat_ptr, rope_ptr, out_ptr, pos_ptr,
    start, T, H, R, HALF,
    sq_t, sq_h, sq_d, skv_t, skp_t, sf_t, s_lat, s_rope,
    eps,
    BLOCK_R: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_H: tl.constexpr,
    HAS_POSITIONS: tl.constexpr,
):  # fmt: skip
    """Token ``t``'s latent norm, rotations and cache writes (see the module docstring)."""
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


@triton.jit(
    do_not_specialize=["start", "sq_t", "sq_h", "sq_d", "skv_t", "skp_t", "sf_t", "s_lat", "s_rope"]
)
def _mla_prologue_kernel(
    q_ptr, kv_ptr, kp_ptr, w_ptr, f_ptr, lat_ptr, rope_ptr, out_ptr, pos_ptr,
    start, T, H, R, HALF,
    sq_t, sq_h, sq_d, skv_t, skp_t, sf_t, s_lat, s_rope,
    eps,
    qn_ptr, wuk_ptr, ql_ptr, NOPE, sn_t, sn_h, sn_d, su_h, su_k,
    BLOCK_R: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_H: tl.constexpr,
    HAS_POSITIONS: tl.constexpr, ABSORB: tl.constexpr = 0, BLOCK_NOPE: tl.constexpr = 16,
    BLOCK_A: tl.constexpr = 16, PDL: tl.constexpr = 0,
):  # fmt: skip
    """Programs ``0 .. T-1``: one token's prologue each. With ``ABSORB``, programs from ``T``
    on: one ``(token, head, BLOCK_A latent columns)`` of ``q_lat = q_nope @ W_UK`` each, its
    constant ``W_UK`` tile loaded before the PDL wait, fixed-order fp32 sums, one rounding."""
    pid = tl.program_id(0)
    if ABSORB:
        if pid >= T:
            _absorb_columns(
                pid - T, qn_ptr, wuk_ptr, ql_ptr, T, H, R, NOPE, sn_t, sn_h, sn_d, su_h, su_k,
                BLOCK_NOPE, BLOCK_A, PDL,
            )  # fmt: skip
        else:
            pdl_enter(PDL)
            _prologue_token(
                pid.to(tl.int64), q_ptr, kv_ptr, kp_ptr, w_ptr, f_ptr, lat_ptr, rope_ptr,
                out_ptr, pos_ptr, start, T, H, R, HALF, sq_t, sq_h, sq_d, skv_t, skp_t, sf_t,
                s_lat, s_rope, eps, BLOCK_R, BLOCK_HALF, BLOCK_H, HAS_POSITIONS,
            )  # fmt: skip
    else:
        pdl_enter(PDL)  # first: with PDL, wait for the previous kernel
        _prologue_token(
            pid.to(tl.int64), q_ptr, kv_ptr, kp_ptr, w_ptr, f_ptr, lat_ptr, rope_ptr, out_ptr,
            pos_ptr, start, T, H, R, HALF, sq_t, sq_h, sq_d, skv_t, skp_t, sf_t, s_lat,
            s_rope, eps, BLOCK_R, BLOCK_HALF, BLOCK_H, HAS_POSITIONS,
        )  # fmt: skip


@triton.jit
def _absorb_columns(
    a, qn_ptr, wuk_ptr, ql_ptr, T, H, R, NOPE, sn_t, sn_h, sn_d, su_h, su_k,
    BLOCK_NOPE: tl.constexpr, BLOCK_A: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    """Absorbing program ``a``: ``q_lat[h, t, cols] = q_nope[t, h] @ W_UK[h][:, cols]``."""
    blocks = tl.cdiv(R, BLOCK_A)
    rb = a % blocks
    h = (a // blocks) % H
    t = (a // blocks // H).to(tl.int64)
    kk = tl.arange(0, BLOCK_NOPE)
    rr = rb * BLOCK_A + tl.arange(0, BLOCK_A)
    w = tl.load(
        wuk_ptr + h * su_h + kk[:, None] * su_k + rr[None, :],
        mask=(kk < NOPE)[:, None] & (rr < R)[None, :],
        other=0.0,
    )  # a weight no kernel of the step writes: read before the wait
    pdl_enter(PDL)
    q = tl.load(qn_ptr + t * sn_t + h * sn_h + kk * sn_d, mask=kk < NOPE, other=0.0)
    q_lat = tl.sum(w.to(tl.float32) * q.to(tl.float32)[:, None], axis=0)
    tl.store(ql_ptr + (h * T + t) * R + rr, q_lat.to(ql_ptr.dtype.element_ty), mask=rr < R)


ABSORB_BLOCK = 64
"""Latent columns of ``q_lat`` one absorbing program computes (a ``[nope, 64]`` tile of
``W_UK``: 16 KB at DeepSeek-V2-Lite's 128 x 512 per head, so 128 programs a token)."""


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
    absorb: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Run the kernel on validated inputs (``freqs [T, rope/2, 2]`` float32, unit strides in
    its last two dims); returns the rotated queries ``[H, T, rope]``, and with ``absorb =
    (q_nope [T, H, nope], W_UK [H, nope, R] with unit stride along R)`` also ``q_lat [H, T,
    R]`` computed in the same launch."""
    T, H, rope = q_pe.shape
    R = kv_nope.shape[1]
    out = torch.empty(H, T, rope, dtype=q_pe.dtype, device=q_pe.device)
    positions = isinstance(rows, torch.Tensor)
    if absorb is None:
        q_nope, w_uk, q_lat, nope, block_a, grid = out, out, out, 1, 16, T
        strides = (0, 0, 0, 0, 0)
    else:
        q_nope, w_uk = absorb
        nope = q_nope.shape[2]
        q_lat = torch.empty(H, T, R, dtype=q_pe.dtype, device=q_pe.device)
        block_a = min(ABSORB_BLOCK, max(16, triton.next_power_of_2(R)))
        grid = T + T * H * triton.cdiv(R, block_a)
        strides = (q_nope.stride(0), q_nope.stride(1), q_nope.stride(2), w_uk.stride(0),
                   w_uk.stride(1))  # fmt: skip
    _mla_prologue_kernel[(grid,)](
        q_pe, kv_nope, k_pe, weight, freqs, latent_cache, rope_cache, out,
        rows if positions else out, 0 if positions else rows, T, H, R, rope // 2,
        q_pe.stride(0), q_pe.stride(1), q_pe.stride(2), kv_nope.stride(0), k_pe.stride(0),
        freqs.stride(0), latent_cache.stride(0), rope_cache.stride(0), eps,
        q_nope, w_uk, q_lat, nope, *strides,
        BLOCK_R=triton.next_power_of_2(R),  # R <= MAX_LATENT: rms_norm's one block
        BLOCK_HALF=triton.next_power_of_2(rope // 2), BLOCK_H=triton.next_power_of_2(H),
        HAS_POSITIONS=positions, ABSORB=int(absorb is not None),
        BLOCK_NOPE=max(16, triton.next_power_of_2(nope)), BLOCK_A=block_a,
        num_warps=NUM_WARPS, enable_fp_fusion=False,
        **pdl_options(q_pe.device, early_trigger=True),
    )  # fmt: skip
    return out if absorb is None else (out, q_lat)
