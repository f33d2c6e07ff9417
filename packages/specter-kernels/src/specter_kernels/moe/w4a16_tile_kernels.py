"""The tensor-core path's Triton kernels of the fused W4A16 layer (launched by
:mod:`specter_kernels.moe.w4a16_triton`): one program per (expert-aligned block of pairs,
N-block, K-split), ``tl.dot`` on tensor cores."""

from __future__ import annotations

import triton
import triton.language as tl

from specter_kernels.pdl import pdl_enter
from specter_kernels.quant.int4_triton import (
    accumulate_rows_and_finish,
    finish_gate_up,
    int4_pair_fp16,
    load_group_params,
    zero_workspace,
)


@triton.jit
def _tile_step(acc, words, scales, zeros, act_rows, act_mask, rows):
    """Add one word tile ``[R, BLOCK_N]`` times ``act_rows`` (``[BM, 1]`` row pointers)."""
    for J in tl.static_range(4):
        lo, hi = int4_pair_fp16(words, J)
        a_lo = tl.load(act_rows + (8 * rows + J)[None, :], mask=act_mask, other=0.0)
        a_hi = tl.load(act_rows + (8 * rows + J + 4)[None, :], mask=act_mask, other=0.0)
        acc = tl.dot(a_lo, (lo - zeros) * scales, acc)
        acc = tl.dot(a_hi, (hi - zeros) * scales, acc)
    return acc


@triton.jit
def _tile_gate_up_kernel(
    x_ptr,
    topk_ids_ptr,
    sorted_ids_ptr,
    expert_ids_ptr,
    num_post_padded_ptr,
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
    num_pairs,
    k_per_split,
    arrivals,
    stride_xt,
    stride_qe,
    stride_qk,
    stride_se,
    stride_sg,
    stride_ht,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HAS_ZEROS: tl.constexpr,
    SPLIT: tl.constexpr,
    ZERO_BLOCK: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    pdl_enter(PDL)  # first: with PDL, wait for the previous kernel
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    if not SPLIT:  # before the early exit: every program takes its share
        zero_workspace(
            down_acc_ptr,
            down_counter_ptr,
            num_down_acc,
            num_down_counters,
            pid_m * tl.num_programs(1) + pid_n,
            tl.num_programs(0) * tl.num_programs(1),
            ZERO_BLOCK,
        )
    if pid_m * BLOCK_M >= tl.load(num_post_padded_ptr):
        return  # block beyond the padded length: the grid is an upper bound
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = tl.load(sorted_ids_ptr + offs_m)
    row_mask = pairs < num_pairs
    # Skipped pairs (id -1) were aligned as expert 0's: their activations read as zeros.
    computed = row_mask & (tl.load(topk_ids_ptr + pairs, mask=row_mask, other=-1) >= 0)
    tokens = pairs // top_k
    R: tl.constexpr = BLOCK_K // 8
    offs_r = tl.arange(0, R)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < I
    qweight = qweight_ptr + expert * stride_qe
    scales = scales_ptr + expert * stride_se
    zeros = zeros_ptr + expert * stride_se
    x_rows = x_ptr + tokens[:, None] * stride_xt
    k_begin = pid_k * k_per_split
    k_end = tl.minimum(k_begin + k_per_split, K)
    acc_gate = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
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
        x_mask = computed[:, None] & r_mask[None, :]
        acc_gate = _tile_step(acc_gate, w_gate, s_gate, z_gate, x_rows, x_mask, rows)
        acc_up = _tile_step(acc_up, w_up, s_up, z_up, x_rows, x_mask, rows)
    finish_gate_up(
        ws_ptr,
        counter_ptr,
        h_ptr,
        pairs,
        row_mask,
        offs_n,
        n_mask,
        acc_gate,
        acc_up,
        I,
        pid_n,
        tl.num_programs(1),
        arrivals,
        stride_ht,
        SPLIT,
    )


@triton.jit
def _tile_down_kernel(
    h_ptr,
    sorted_ids_ptr,
    expert_ids_ptr,
    num_post_padded_ptr,
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
    num_pairs,
    k_per_split,
    arrivals,
    stride_ht,
    stride_qe,
    stride_qk,
    stride_se,
    stride_sg,
    stride_ot,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HAS_ZEROS: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    pdl_enter(PDL)  # first: with PDL, wait for the previous kernel
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    if pid_m * BLOCK_M >= tl.load(num_post_padded_ptr):
        return
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = tl.load(sorted_ids_ptr + offs_m)
    row_mask = pairs < num_pairs
    tokens = pairs // top_k
    routing_weights = tl.load(topk_weights_ptr + pairs, mask=row_mask, other=0.0).to(tl.float32)
    R: tl.constexpr = BLOCK_K // 8
    offs_r = tl.arange(0, R)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    qweight = qweight_ptr + expert * stride_qe
    scales = scales_ptr + expert * stride_se
    zeros = zeros_ptr + expert * stride_se
    h_rows = h_ptr + pairs[:, None] * stride_ht
    k_begin = pid_k * k_per_split
    k_end = tl.minimum(k_begin + k_per_split, K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
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
        acc = _tile_step(acc, w, s, z, h_rows, row_mask[:, None] & r_mask[None, :], rows)
    accumulate_rows_and_finish(
        acc_ptr,
        counter_ptr,
        out_ptr,
        tokens,
        row_mask,
        offs_n,
        n_mask,
        acc * routing_weights[:, None],
        N,
        pid_n,
        tl.num_programs(1),
        arrivals,
        stride_ot,
    )
