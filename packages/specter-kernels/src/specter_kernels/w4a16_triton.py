"""Triton kernels of the fused W4A16 routed-expert layer, and their launchers.

Per layer two launches whatever T (plus a memset when gate_up is split over K):
gate_up (SiLU-and-mul fused into its epilogue) writes ``h [T*k, I]`` fp16, then
down multiplies by the routing weight and sums each token's experts into
``out [T, H]`` fp16. Both projections split K over several programs: at decode a
program's serial chain of dependent loads, not bandwidth, sets the time, so
short K ranges and many resident programs keep enough bytes in flight. Partial
sums meet in an fp32 workspace; the last arriving program of an output tile
finishes it (``int4_triton.finish_gate_up`` / ``accumulate_rows_and_finish``).
An unsplit gate_up launch zeroes the down launch's workspace itself.

Two ways to map work onto programs:

* ``gemv``: one program per (routed pair, N-block, K-split); no alignment launch,
  no padded rows, CUDA-core FMAs. Best at decode (few pairs): every weight byte a
  pair needs is read once, by one program.
* ``tile``: pairs sorted by expert (``moe_align_block_size``) into blocks of
  BLOCK_M rows; one program per (block, N-block, K-split) multiplies on tensor
  cores (``tl.dot``, every dot dim >= 16). Reads each expert once per block, so it
  wins once tokens share experts (prefill, long verification).

Grids come from host-known sizes (T, k, E), never from device values.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from specter_kernels.int4_triton import (
    accumulate_rows_and_finish,
    finish_gate_up,
    int4_fp32_minus,
    int4_pair_fp16,
    int4_word_dot8,
    load_group_params,
    zero_workspace,
)
from specter_kernels.int4_weight import Int4Weight
from specter_kernels.moe_align import max_aligned_blocks, moe_align_block_size
from specter_kernels.pdl import pdl_enter, pdl_options


@dataclass(frozen=True)
class GemvConfig:
    """Tile shape of one gemv-path launch.

    Attributes:
        block_n: outputs per program (gate_up: per half, so it reads 2x block_n columns).
        block_k: inputs per loop step; a multiple of 8 (block_k / 8 word rows).
        split_k: programs sharing one output tile's K range.
        num_warps: warps per program.
        num_stages: software-pipelining depth.
        math: inner-loop arithmetic, see ``_gemv_step`` (0 fp16, 1 fp32 magic, 2 dot,
            3 packed f16x2).
    """

    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 2
    math: int = 0


@dataclass(frozen=True)
class TileConfig:
    """Tile shape of one tensor-core-path launch.

    Attributes:
        block_m: routed pairs per block (the alignment's block size), >= 16.
        block_n: outputs per program, >= 16.
        block_k: inputs per loop step; block_k / 8 >= 16 because each of the eight
            nibble slices is one ``tl.dot`` of depth block_k / 8.
        split_k: programs sharing one output tile's K range.
        num_warps: warps per program.
        num_stages: software-pipelining depth.
    """

    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 2


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


def _k_per_split(K: int, block_k: int, split_k: int) -> tuple[int, int]:
    """K range per split, a multiple of block_k, and the number of non-empty splits."""
    per_split = triton.cdiv(triton.cdiv(K, split_k), block_k) * block_k
    return per_split, triton.cdiv(K, per_split)


def _zeros_arg(w: Int4Weight) -> torch.Tensor:
    # Symmetric weights pass the scales as a never-read stand-in pointer.
    return w.zeros if w.zeros is not None else w.scales


@dataclass
class _Workspace:
    """Zeroed fp32 partial sums and int32 arrival counters of one layer call."""

    gate_up: torch.Tensor  # fp32 [pairs, 2I] (empty when gate_up is not split)
    gate_up_counters: torch.Tensor  # int32 [pairs, N-blocks of gate_up]
    down: torch.Tensor  # fp32 [T, H]
    down_counters: torch.Tensor  # int32 [T, N-blocks of down]


ZERO_BLOCK = 256


def _workspace(
    T: int, H: int, I: int, pairs: int, nb_gate_up: int, nb_down: int, split_gate_up: bool, device
) -> _Workspace:
    """One allocation carved into the four workspaces.

    Split gate_up: zeroed here (one memset). Otherwise it holds only the down
    workspace, left for the gate_up kernel to zero.
    """
    gu = pairs * 2 * I if split_gate_up else 0
    gu_cnt = pairs * nb_gate_up if split_gate_up else 0
    down, down_cnt = T * H, T * nb_down
    alloc = torch.zeros if split_gate_up else torch.empty
    words = alloc(gu + down + gu_cnt + down_cnt, dtype=torch.int32, device=device)
    floats = words[: gu + down].view(torch.float32)  # all-zero bits are 0.0
    counters = words[gu + down :]
    return _Workspace(floats[:gu], counters[:gu_cnt], floats[gu:], counters[gu_cnt:])


def launch_gemv(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: Int4Weight,
    w2: Int4Weight,
    gate_up_config: GemvConfig,
    down_config: GemvConfig,
) -> torch.Tensor:
    """The gemv path (arguments as in ``fused_moe_w4a16``, validated there)."""
    T, H = x.shape
    top_k = topk_ids.shape[1]
    I = w2.in_features
    pairs = T * top_k
    device = x.device
    ids = topk_ids.reshape(-1)
    cu, cd = gate_up_config, down_config
    for c in (cu, cd):
        if c.math not in (0, 1, 2, 3):
            raise ValueError(f"math must be 0, 1, 2 or 3, got {c.math} in {c}")
        if c.math == 2 and (c.block_k < 128 or c.block_n < 16):
            raise ValueError(f"math=2 (tl.dot) needs block_k >= 128 and block_n >= 16, got {c}")
    asm = int(device.type == "cuda")  # math 3's PTX; the interpreter runs Triton ops
    gu_per_split, gu_splits = _k_per_split(H, cu.block_k, cu.split_k)
    dn_per_split, dn_splits = _k_per_split(I, cd.block_k, cd.split_k)
    nb_gu, nb_dn = triton.cdiv(I, cu.block_n), triton.cdiv(H, cd.block_n)
    ws = _workspace(T, H, I, pairs, nb_gu, nb_dn, gu_splits > 1, device)
    h = torch.empty(pairs, I, dtype=torch.float16, device=device)
    out = torch.empty(T, H, dtype=torch.float16, device=device)
    _gemv_gate_up_kernel[(pairs, nb_gu, gu_splits)](
        x, ids, w13.qweight, w13.scales, _zeros_arg(w13), h, ws.gate_up, ws.gate_up_counters,
        ws.down, ws.down_counters, ws.down.numel(), ws.down_counters.numel(),
        H, I, top_k, gu_per_split, gu_splits,
        x.stride(0), w13.qweight.stride(0), w13.qweight.stride(1),
        w13.scales.stride(0), w13.scales.stride(1), h.stride(0),
        GROUP=w13.group_size, BLOCK_N=cu.block_n, BLOCK_K=cu.block_k,
        HAS_ZEROS=w13.zeros is not None, MATH=cu.math, SPLIT=gu_splits > 1, ZERO_BLOCK=ZERO_BLOCK,
        ASM=asm, num_warps=cu.num_warps, num_stages=cu.num_stages,
        **pdl_options(x.device),
    )  # fmt: skip
    _gemv_down_kernel[(pairs, nb_dn, dn_splits)](
        h, ids, topk_weights.reshape(-1), w2.qweight, w2.scales, _zeros_arg(w2),
        ws.down, ws.down_counters, out,
        I, H, top_k, dn_per_split, top_k * dn_splits,
        h.stride(0), w2.qweight.stride(0), w2.qweight.stride(1),
        w2.scales.stride(0), w2.scales.stride(1), out.stride(0),
        GROUP=w2.group_size, BLOCK_N=cd.block_n, BLOCK_K=cd.block_k,
        HAS_ZEROS=w2.zeros is not None, MATH=cd.math,
        ASM=asm, num_warps=cd.num_warps, num_stages=cd.num_stages,
        **pdl_options(h.device),
    )  # fmt: skip
    return out


def launch_tile(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: Int4Weight,
    w2: Int4Weight,
    gate_up_config: TileConfig,
    down_config: TileConfig,
) -> torch.Tensor:
    """The tensor-core path (arguments as in ``fused_moe_w4a16``, validated there).

    Both launches share one alignment, so their block_m must be equal.
    """
    cu, cd = gate_up_config, down_config
    if cu.block_m != cd.block_m:
        raise ValueError(
            f"gate_up and down tile configs must share block_m, got {cu.block_m} and {cd.block_m}"
        )
    for c in (cu, cd):
        if c.block_k < 128 or c.block_n < 16 or c.block_m < 16:
            raise ValueError(f"tile configs need block_k >= 128 and block_m, block_n >= 16: {c}")
    T, H = x.shape
    top_k = topk_ids.shape[1]
    I = w2.in_features
    E = w13.num_experts
    pairs = T * top_k
    device = x.device
    # Skipped pairs (-1) go into expert 0's blocks so that they still arrive; the gate_up
    # kernel zeroes their activations (a row of zeros in h, nothing added to out).
    aligned = topk_ids.clamp_min(0)
    sorted_ids, expert_ids, num_post_padded = moe_align_block_size(aligned, E, cu.block_m)
    max_blocks = max_aligned_blocks(pairs, E, cu.block_m)
    gu_per_split, gu_splits = _k_per_split(H, cu.block_k, cu.split_k)
    dn_per_split, dn_splits = _k_per_split(I, cd.block_k, cd.split_k)
    nb_gu, nb_dn = triton.cdiv(I, cu.block_n), triton.cdiv(H, cd.block_n)
    ws = _workspace(T, H, I, pairs, nb_gu, nb_dn, gu_splits > 1, device)
    h = torch.empty(pairs, I, dtype=torch.float16, device=device)
    out = torch.empty(T, H, dtype=torch.float16, device=device)
    _tile_gate_up_kernel[(max_blocks, nb_gu, gu_splits)](
        x, topk_ids.reshape(-1), sorted_ids, expert_ids, num_post_padded,
        w13.qweight, w13.scales, _zeros_arg(w13), h, ws.gate_up, ws.gate_up_counters,
        ws.down, ws.down_counters, ws.down.numel(), ws.down_counters.numel(),
        H, I, top_k, pairs, gu_per_split, gu_splits,
        x.stride(0), w13.qweight.stride(0), w13.qweight.stride(1),
        w13.scales.stride(0), w13.scales.stride(1), h.stride(0),
        GROUP=w13.group_size, BLOCK_M=cu.block_m, BLOCK_N=cu.block_n, BLOCK_K=cu.block_k,
        HAS_ZEROS=w13.zeros is not None, SPLIT=gu_splits > 1, ZERO_BLOCK=ZERO_BLOCK,
        num_warps=cu.num_warps, num_stages=cu.num_stages,
        **pdl_options(x.device),
    )  # fmt: skip
    _tile_down_kernel[(max_blocks, nb_dn, dn_splits)](
        h, sorted_ids, expert_ids, num_post_padded, topk_weights.reshape(-1),
        w2.qweight, w2.scales, _zeros_arg(w2), ws.down, ws.down_counters, out,
        I, H, top_k, pairs, dn_per_split, top_k * dn_splits,
        h.stride(0), w2.qweight.stride(0), w2.qweight.stride(1),
        w2.scales.stride(0), w2.scales.stride(1), out.stride(0),
        GROUP=w2.group_size, BLOCK_M=cd.block_m, BLOCK_N=cd.block_n, BLOCK_K=cd.block_k,
        HAS_ZEROS=w2.zeros is not None,
        num_warps=cd.num_warps, num_stages=cd.num_stages,
        **pdl_options(h.device),
    )  # fmt: skip
    return out
