"""Triton building blocks for INT4 weights dequantized in registers.

Unpacking uses the fp16 magic-number trick: OR-ing a nibble into the mantissa of
1024.0 (bits 0x6400) gives the fp16 value ``1024 + q`` with no int-to-float
conversion, and one 32-bit AND/OR produces two such halves at once (nibbles j
and j + 4 of a word, which sit 16 bits apart). ``(1024 + q) - (1024 + zero)`` is
exact in fp16, and one multiply by the fp16 scale rounds once, exactly as
:func:`specter_kernels.dequantize_int4` does, so kernels and reference see the
same weights bit for bit.

Because the halves come out as nibble pairs (j, j + 4), kernels work on
``[BLOCK_K / 8, BLOCK_N]`` word tiles and handle input index ``8 * r + j`` as
eight slices j = 0..7 of ``BLOCK_K / 8`` rows each; the activations are loaded
with the matching stride 8.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def int4_pair_fp16(words, J: tl.constexpr):
    """Nibbles J and J + 4 (J in 0..3) of int32 ``words`` as fp16 ``1024 + q``."""
    halves = ((words >> (4 * J)) & 0x000F000F) | 0x64006400
    lo = (halves & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True)
    hi = (halves >> 16).to(tl.int16).to(tl.float16, bitcast=True)
    return lo, hi


ACTIVATION_SHIFT = 1.0 / 256.0
"""Power of two the packed math (``int4_word_dot8``) scales activations by before its fp16
products: ``|x| <= 65504`` times 256**-1, times ``|q - zero| <= 15``, four terms deep, stays
under fp16's largest value, so no fp16 input can overflow a partial sum. Exact (a power of
two); undone in fp32 with the weight scale."""

_WORD_DOT8_PTX = tl.constexpr("""
{
.reg .b32 t, h, a;
.reg .b16 l, u;
.reg .f32 fl, fu;
lop3.b32 h, $1, 0x000F000F, 0x64006400, 0xEA;
sub.f16x2 h, h, $6;
mul.rn.f16x2 a, h, $2;
shr.u32 t, $1, 4;
lop3.b32 h, t, 0x000F000F, 0x64006400, 0xEA;
sub.f16x2 h, h, $6;
fma.rn.f16x2 a, h, $3, a;
shr.u32 t, $1, 8;
lop3.b32 h, t, 0x000F000F, 0x64006400, 0xEA;
sub.f16x2 h, h, $6;
fma.rn.f16x2 a, h, $4, a;
shr.u32 t, $1, 12;
lop3.b32 h, t, 0x000F000F, 0x64006400, 0xEA;
sub.f16x2 h, h, $6;
fma.rn.f16x2 a, h, $5, a;
mov.b32 {l, u}, a;
cvt.f32.f16 fl, l;
cvt.f32.f16 fu, u;
add.f32 $0, fl, fu;
}
""")
_SHIFT = tl.constexpr(ACTIVATION_SHIFT)


@triton.jit
def f16x2_bits(lo, hi):
    """Two fp16 tensors as one int32 tensor of f16x2 registers (``lo`` in the low half)."""
    lo_bits = lo.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    hi_bits = hi.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    return lo_bits | (hi_bits << 16)


@triton.jit
def int4_word_dot8(words, act_row, rows, r_mask, scales, zeros, ASM: tl.constexpr):
    """``scale * sum_j x[8 r + j] * (q_j - zero)`` over the 8 nibbles of each word, fp32.

    ``words [R, BLOCK_N]`` int32 (word row ``r`` = ``rows[i]`` holds inputs ``8 r .. 8 r + 7``);
    ``act_row`` points at the activation row; ``scales`` (fp16) and ``zeros`` (fp16
    ``1024 + zero``) broadcast to the words. Returns ``[R, BLOCK_N]`` fp32.

    The packed math: each 32-bit AND/OR of the magic-number trick gives nibbles (J, J + 4)
    as an f16x2 register ``1024 + q``; one f16x2 subtraction makes both ``q - zero`` exactly,
    and four f16x2 fused multiply-adds with the activations packed the same way sum each
    half's four products in fp16, the activations scaled by ``ACTIVATION_SHIFT`` first. The
    two halves are widened and added in fp32, and one fp32 multiply by ``scale /
    ACTIVATION_SHIFT`` a word gives the result. In the
    sm_90 build of the gate_up gemv the loop takes about 26 instructions a word, against
    about 44 for dequantizing every value to fp16 and widening it (``MATH`` 0); on an H200
    that made Phi-3.5-MoE's T = 1 gate_up 18% faster (DeepSeek-V2-Lite's, where narrow
    tiles did most of the work, 5%).

    ``ASM``: the inline PTX (CUDA); else the same arithmetic in Triton operations (the
    interpreter cannot run PTX; its fp16 products round separately from their adds).
    """
    unshift = scales.to(tl.float32) * (1.0 / _SHIFT)
    if ASM:
        lo0, hi0 = _activation_pair(act_row, rows, r_mask, 0)
        lo1, hi1 = _activation_pair(act_row, rows, r_mask, 1)
        lo2, hi2 = _activation_pair(act_row, rows, r_mask, 2)
        lo3, hi3 = _activation_pair(act_row, rows, r_mask, 3)
        shifted = tl.inline_asm_elementwise(
            _WORD_DOT8_PTX,
            "=f,r,r,r,r,r,r",
            [
                words,
                f16x2_bits(lo0, hi0)[:, None],
                f16x2_bits(lo1, hi1)[:, None],
                f16x2_bits(lo2, hi2)[:, None],
                f16x2_bits(lo3, hi3)[:, None],
                f16x2_bits(zeros, zeros),
            ],
            dtype=tl.float32,
            is_pure=True,
            pack=1,
        )
    else:
        lo_sum = tl.zeros(words.shape, dtype=tl.float16)
        hi_sum = tl.zeros(words.shape, dtype=tl.float16)
        for J in tl.static_range(4):
            lo, hi = int4_pair_fp16(words, J)
            a_lo, a_hi = _activation_pair(act_row, rows, r_mask, J)
            lo_sum += (lo - zeros) * a_lo[:, None]
            hi_sum += (hi - zeros) * a_hi[:, None]
        shifted = lo_sum.to(tl.float32) + hi_sum.to(tl.float32)
    return shifted * unshift


@triton.jit
def _activation_pair(act_row, rows, r_mask, J: tl.constexpr):
    """Activations ``8 r + J`` and ``8 r + J + 4`` of word rows ``rows [R]``, times
    ``ACTIVATION_SHIFT``, as fp16 ``[R]`` each (the nibble pair ``int4_pair_fp16`` gives)."""
    lo = tl.load(act_row + 8 * rows + J, mask=r_mask, other=0.0) * _SHIFT
    hi = tl.load(act_row + 8 * rows + J + 4, mask=r_mask, other=0.0) * _SHIFT
    return lo.to(tl.float16), hi.to(tl.float16)


@triton.jit
def int4_fp32_minus(words, SHIFT: tl.constexpr, magic_zero):
    """The nibble at bit SHIFT as exact fp32 ``q - zero``.

    OR-ing the nibble into the mantissa of 2**23 (0x4B000000) reads as ``2**23 + q``;
    ``magic_zero`` is ``2**23 + zero``, so one subtraction gives the integer exactly.
    """
    magic = ((words >> SHIFT) & 0xF) | 0x4B000000
    return magic.to(tl.float32, bitcast=True) - magic_zero


@triton.jit
def load_group_params(
    scales_ptr,
    zeros_ptr,
    k0,
    word_rows,
    row_mask,
    offs_n,
    n_mask,
    stride_g,
    GROUP: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HAS_ZEROS: tl.constexpr,
):
    """Scales and ``1024 + zero`` (fp16) for a word tile starting at input ``k0``.

    ``scales_ptr``/``zeros_ptr`` already point at the expert. When the tile lies
    inside one group (GROUP a multiple of BLOCK_K, k0 a multiple of BLOCK_K) one
    row ``[1, BLOCK_N]`` is loaded and broadcast; otherwise ``[BLOCK_K / 8, BLOCK_N]``.
    """
    if GROUP % BLOCK_K == 0:
        group = k0 // GROUP
        ptrs = group * stride_g + offs_n[None, :]
        mask = n_mask[None, :]
    else:
        group = word_rows // (GROUP // 8)
        ptrs = group[:, None] * stride_g + offs_n[None, :]
        mask = row_mask[:, None] & n_mask[None, :]
    scales = tl.load(scales_ptr + ptrs, mask=mask, other=0.0)
    if HAS_ZEROS:
        zeros = tl.load(zeros_ptr + ptrs, mask=mask, other=8).to(tl.float16) + 1024.0
    else:
        zeros = tl.full([1, 1], 1032.0, dtype=tl.float16)  # 1024 + symmetric zero point 8
    return scales, zeros


@triton.jit
def zero_workspace(
    acc_ptr, counter_ptr, num_acc, num_counters, pid, num_programs, ZERO_BLOCK: tl.constexpr
):
    """Zero the down projection's fp32 accumulator and counters, spread over all programs.

    An unsplit gate_up launch does this for the down launch that follows it on the
    same stream, which saves a memset launch per layer (about 2 us at decode).
    """
    offs = tl.arange(0, ZERO_BLOCK)
    for start in range(pid * ZERO_BLOCK, num_acc, num_programs * ZERO_BLOCK):
        tl.store(
            acc_ptr + start + offs, tl.zeros([ZERO_BLOCK], tl.float32), mask=start + offs < num_acc
        )
    for start in range(pid * ZERO_BLOCK, num_counters, num_programs * ZERO_BLOCK):
        tl.store(
            counter_ptr + start + offs,
            tl.zeros([ZERO_BLOCK], tl.int32),
            mask=start + offs < num_counters,
        )


@triton.jit
def finish_gate_up(
    ws_ptr,
    counter_ptr,
    h_ptr,
    rows,
    row_mask,
    offs_n,
    n_mask,
    gate,
    up,
    I,
    pid_n,
    num_pid_n,
    arrivals,
    stride_h,
    SPLIT: tl.constexpr,
):
    """Write ``h = silu(gate) * up`` (fp16) for pair ``rows``; gate/up are ``[BM, BLOCK_N]``.

    Without SPLIT the sums are complete. With SPLIT, ``arrivals`` programs each hold a
    K-slice of them: each adds its part into the fp32 workspace ``ws [pairs, 2I]``
    (gate in ``[:I]``, up in ``[I:]``), takes a ticket, and the program with the last
    ticket applies the activation to the finished sums (see accumulate_rows_and_finish).
    """
    mask = row_mask[:, None] & n_mask[None, :]
    if SPLIT:
        gate_ptrs = ws_ptr + rows[:, None] * (2 * I) + offs_n[None, :]
        tl.atomic_add(gate_ptrs, gate, mask=mask)
        tl.atomic_add(gate_ptrs + I, up, mask=mask)
        tl.debug_barrier()
        tickets = tl.atomic_add(counter_ptr + rows * num_pid_n + pid_n, 1, mask=row_mask)
        tl.debug_barrier()
        last = row_mask & (tickets == arrivals - 1)
        mask = last[:, None] & n_mask[None, :]
        gate = tl.where(mask, tl.atomic_add(gate_ptrs, 0.0, mask=mask), 0.0)
        up = tl.where(mask, tl.atomic_add(gate_ptrs + I, 0.0, mask=mask), 0.0)
    h = gate * tl.sigmoid(gate) * up
    tl.store(h_ptr + rows[:, None] * stride_h + offs_n[None, :], h.to(tl.float16), mask=mask)


@triton.jit
def accumulate_rows_and_finish(
    acc_ptr,
    counter_ptr,
    out_ptr,
    tokens,
    row_mask,
    offs_n,
    n_mask,
    partial,
    N,
    pid_n,
    num_pid_n,
    arrivals,
    stride_out,
):
    """Add ``partial [BLOCK_M, BLOCK_N]`` into the token rows of the fp32 accumulator;
    the last of the ``arrivals`` contributions to a (token, N-block) writes fp16 out.

    Every (token, N-block) receives exactly ``arrivals`` = top_k x split_k
    contributions. Each program adds its part atomically, then takes a ticket from
    that tile's counter; whoever draws the last ticket reads the finished fp32 sum
    (atomically, so it sees every other program's adds) and stores it as fp16.
    That makes the routed sum over experts and split-K one launch with no
    separate reduction or conversion kernel.
    """
    ptrs = acc_ptr + tokens[:, None] * N + offs_n[None, :]
    mask = row_mask[:, None] & n_mask[None, :]
    tl.atomic_add(ptrs, partial, mask=mask)
    # All threads' adds must precede the ticket (release by the ticket's atomic).
    tl.debug_barrier()
    tickets = tl.atomic_add(counter_ptr + tokens * num_pid_n + pid_n, 1, mask=row_mask)
    tl.debug_barrier()
    last = row_mask & (tickets == arrivals - 1)
    last_mask = last[:, None] & n_mask[None, :]
    total = tl.atomic_add(ptrs, 0.0, mask=last_mask)
    tl.store(
        out_ptr + tokens[:, None] * stride_out + offs_n[None, :],
        tl.where(last_mask, total, 0.0).to(tl.float16),  # masked lanes hold garbage
        mask=last_mask,
    )
