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
