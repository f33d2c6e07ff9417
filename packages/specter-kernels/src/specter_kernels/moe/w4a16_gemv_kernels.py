"""The gemv path's Triton kernels of the fused W4A16 layer (launched by
:mod:`specter_kernels.moe.w4a16_triton`): one program per (routed pair, N-block, K-split),
CUDA-core multiply-adds."""

from __future__ import annotations

import triton
import triton.language as tl

from specter_kernels.pdl import pdl_enter
from specter_kernels.quant.int4_triton import (
    accumulate_rows_and_finish,
    finish_gate_up,
    int4_fp32_minus,
    int4_pair_fp16,
    int4_word_dot8,
    load_group_params,
    zero_workspace,
)


@triton.jit
def _gemv_step(
    acc,
    words,
    scales,
    zeros,
    act_row,
    rows,
    r_mask,
    R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MATH: tl.constexpr,
    ASM: tl.constexpr,
):
    """Add one word tile ``[R, BLOCK_N]`` (inputs ``8 * rows + j``) times one activation row.

    MATH selects the arithmetic (all equal up to fp32 rounding):
    0: dequantize to fp16 exactly as the reference, widen, FMA into ``acc [R, BLOCK_N]``;
    1: exact fp32 ``q - zero`` by the 2**23 magic number, FMA into a tile sum, one
       scale multiply per word instead of per value (fewest instructions per value);
    2: tensor cores, activation as row 0 of a 16-row operand, ``acc [16, BLOCK_N]``;
    3: packed f16x2 products of each word's nibble pairs with the activations, one fp32
       scale multiply-add per word (``int4_triton.int4_word_dot8``; ``ASM``: its PTX).
    """
    if MATH == 3:
        acc += int4_word_dot8(words, act_row, rows, r_mask, scales, zeros, ASM)
    elif MATH == 1:
        magic_zero = (zeros - 1024.0).to(tl.float32) + 8388608.0
        tile = tl.zeros([R, BLOCK_N], dtype=tl.float32)
        for J in tl.static_range(8):
            a = tl.load(act_row + 8 * rows + J, mask=r_mask, other=0.0).to(tl.float32)[:, None]
            tile += a * int4_fp32_minus(words, 4 * J, magic_zero)
        acc += tile * scales.to(tl.float32)
    elif MATH == 2:
        first_row = (tl.arange(0, 16) == 0)[:, None]
        for J in tl.static_range(4):
            lo, hi = int4_pair_fp16(words, J)
            a_lo = tl.load(
                act_row + (8 * rows + J)[None, :], mask=first_row & r_mask[None, :], other=0.0
            )
            a_hi = tl.load(
                act_row + (8 * rows + J + 4)[None, :], mask=first_row & r_mask[None, :], other=0.0
            )
            acc = tl.dot(a_lo, (lo - zeros) * scales, acc)
            acc = tl.dot(a_hi, (hi - zeros) * scales, acc)
    else:
        for J in tl.static_range(4):
            lo, hi = int4_pair_fp16(words, J)
            a_lo = tl.load(act_row + 8 * rows + J, mask=r_mask, other=0.0).to(tl.float32)[:, None]
            a_hi = tl.load(act_row + 8 * rows + J + 4, mask=r_mask, other=0.0).to(tl.float32)[
                :, None
            ]
            acc += a_lo * ((lo - zeros) * scales).to(tl.float32)
            acc += a_hi * ((hi - zeros) * scales).to(tl.float32)
    return acc


@triton.jit
def _gemv_gate_up_kernel(
    x_ptr,
    topk_ids_ptr,
    qweight_ptr,
    scales_ptr,
    zeros_ptr,
    h_ptr,
    ws_ptr,
    counter_ptr,
    down_acc_ptr,
    down_counter_ptr,
    num_down_acc,
    num_down_counters,
    K,
    I,
    top_k,
    k_per_split,
    arrivals,
    stride_xt,
    stride_qe,
    stride_qk,
    stride_se,
    stride_sg,
    stride_ht,
    GROUP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HAS_ZEROS: tl.constexpr,
    MATH: tl.constexpr,
    SPLIT: tl.constexpr,
    ZERO_BLOCK: tl.constexpr,
    ASM: tl.constexpr = 0,
    PDL: tl.constexpr = 0,
):
    pdl_enter(PDL)  # first: with PDL, wait for the previous kernel
    pair = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    if not SPLIT:
        zero_workspace(
            down_acc_ptr,
            down_counter_ptr,
            num_down_acc,
            num_down_counters,
            pair * tl.num_programs(1) + pid_n,
            tl.num_programs(0) * tl.num_programs(1),
            ZERO_BLOCK,
        )
    token = pair // top_k
    expert = tl.load(topk_ids_ptr + pair).to(tl.int64)
    skipped = expert < 0  # a pair with no expert: no loop below, h row of zeros
    expert = tl.maximum(expert, 0)
    R: tl.constexpr = BLOCK_K // 8
    offs_r = tl.arange(0, R)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < I
    qweight = qweight_ptr + expert * stride_qe
    scales = scales_ptr + expert * stride_se
    zeros = zeros_ptr + expert * stride_se
    x_row = x_ptr + token * stride_xt
    k_begin = pid_k * k_per_split
    k_end = tl.where(skipped, k_begin, tl.minimum(k_begin + k_per_split, K))
    if MATH == 2:
        acc_gate = tl.zeros([16, BLOCK_N], dtype=tl.float32)
        acc_up = tl.zeros([16, BLOCK_N], dtype=tl.float32)
    else:
        acc_gate = tl.zeros([R, BLOCK_N], dtype=tl.float32)
        acc_up = tl.zeros([R, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        rows = k0 // 8 + offs_r
        r_mask = rows < k_end // 8
        mask = r_mask[:, None] & n_mask[None, :]
        w_ptrs = qweight + rows[:, None] * stride_qk + offs_n[None, :]
        w_gate = tl.load(w_ptrs, mask=mask, other=0)
        w_up = tl.load(w_ptrs + I, mask=mask, other=0)
        s_gate, z_gate = load_group_params(
            scales, zeros, k0, rows, r_mask, offs_n, n_mask, stride_sg, GROUP, BLOCK_K, HAS_ZEROS
        )
        s_up, z_up = load_group_params(
            scales,
            zeros,
            k0,
            rows,
            r_mask,
            offs_n + I,
            n_mask,
            stride_sg,
            GROUP,
            BLOCK_K,
            HAS_ZEROS,
        )
        acc_gate = _gemv_step(
            acc_gate, w_gate, s_gate, z_gate, x_row, rows, r_mask, R, BLOCK_N, MATH, ASM
        )
        acc_up = _gemv_step(acc_up, w_up, s_up, z_up, x_row, rows, r_mask, R, BLOCK_N, MATH, ASM)
    finish_gate_up(
        ws_ptr,
        counter_ptr,
        h_ptr,
        tl.zeros([1], dtype=tl.int32) + pair,
        tl.full([1], True, tl.int1),
        offs_n,
        n_mask,
        tl.sum(acc_gate, axis=0)[None, :],
        tl.sum(acc_up, axis=0)[None, :],
        I,
        pid_n,
        tl.num_programs(1),
        arrivals,
        stride_ht,
        SPLIT,
    )


@triton.jit
def _gemv_down_kernel(
    h_ptr,
    topk_ids_ptr,
    topk_weights_ptr,
    qweight_ptr,
    scales_ptr,
    zeros_ptr,
    acc_ptr,
    counter_ptr,
    out_ptr,
    K,
    N,
    top_k,
    k_per_split,
    arrivals,
    stride_ht,
    stride_qe,
    stride_qk,
    stride_se,
    stride_sg,
    stride_ot,
    GROUP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HAS_ZEROS: tl.constexpr,
    MATH: tl.constexpr,
    ASM: tl.constexpr = 0,
    PDL: tl.constexpr = 0,
):
    pdl_enter(PDL)  # first: with PDL, wait for the previous kernel
    pair = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    token = pair // top_k
    expert = tl.load(topk_ids_ptr + pair).to(tl.int64)
    skipped = expert < 0  # still arrives (its tile counts every pair), adding zeros
    expert = tl.maximum(expert, 0)
    routing_weight = tl.load(topk_weights_ptr + pair).to(tl.float32)
    R: tl.constexpr = BLOCK_K // 8
    offs_r = tl.arange(0, R)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    qweight = qweight_ptr + expert * stride_qe
    scales = scales_ptr + expert * stride_se
    zeros = zeros_ptr + expert * stride_se
    h_row = h_ptr + pair * stride_ht
    k_begin = pid_k * k_per_split
    k_end = tl.where(skipped, k_begin, tl.minimum(k_begin + k_per_split, K))
    if MATH == 2:
        acc = tl.zeros([16, BLOCK_N], dtype=tl.float32)
    else:
        acc = tl.zeros([R, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        rows = k0 // 8 + offs_r
        r_mask = rows < k_end // 8
        w = tl.load(
            qweight + rows[:, None] * stride_qk + offs_n[None, :],
            mask=r_mask[:, None] & n_mask[None, :],
            other=0,
        )
        s, z = load_group_params(
            scales, zeros, k0, rows, r_mask, offs_n, n_mask, stride_sg, GROUP, BLOCK_K, HAS_ZEROS
        )
        acc = _gemv_step(acc, w, s, z, h_row, rows, r_mask, R, BLOCK_N, MATH, ASM)
    accumulate_rows_and_finish(
        acc_ptr,
        counter_ptr,
        out_ptr,
        tl.zeros([1], dtype=tl.int32) + token,
        tl.full([1], True, tl.int1),
        offs_n,
        n_mask,
        (tl.sum(acc, axis=0) * routing_weight)[None, :],
        N,
        pid_n,
        tl.num_programs(1),
        arrivals,
        stride_ot,
    )
