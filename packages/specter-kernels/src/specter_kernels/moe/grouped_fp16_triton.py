"""Triton kernels of the grouped FP16 expert layer over cache slots, and the launcher.

Pairs routed to experts of the current wave are sorted by expert
(``moe_align_block_size`` with the wave's mask); each program multiplies one
block of BLOCK_M pairs by one expert's FP16 weights, read from the slot that
``expert_to_slot`` names. gate_up writes ``silu(gate) * up`` as fp16 ``h``;
down multiplies by the routing weight and adds into the caller's fp32 output
with atomics, so successive waves accumulate into one tensor. With a per-pair
output ``[T, k, H]`` it stores each pair's row instead (one fixed tile config,
no split-K, no atomics): deterministic and batch-invariant.

``pair_blocks`` skips the alignment: program ``p`` takes routed pair ``p`` alone
(``PAIR_BLOCKS``), reading its expert from ``topk_ids`` and the wave's mask itself. It is
the default for one routed row (plain decoding), whose k pairs have distinct experts, so no
weight read is shared; callers ask for it on waves of few rows, where launches and host
work cost more than reading an expert once per pair. A pair's result does not depend on
its row in a block, so it has the aligned launch's bits.

``STREAM`` (a ``StreamedExperts``): an expert whose ``expert_to_slot`` entry is -1 reads its
weights from its streamed address (pinned host memory, over PCIe) instead of a slot, and
its first program flags it; the arithmetic does not change, so neither do the bits.

``FILL`` (``fill_slots``, see ``streamed_fills``): a streamed expert with a fill slot also has
every weight tile its first block's programs load stored into that slot (which nothing else
reads), so after the launch the slot holds the whole expert. Only the first block of an
expert stores (an expert's blocks are contiguous after alignment; under ``PAIR_BLOCKS`` the
launcher allows fills for one row only, whose pairs have distinct experts).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from specter_kernels.moe.align import max_aligned_blocks, moe_align_block_size
from specter_kernels.pdl import pdl_enter, pdl_options
from specter_kernels.streaming.experts import StreamedExperts


@dataclass(frozen=True)
class GroupedConfig:
    """Tile shape of one grouped FP16 launch.

    Attributes:
        block_m: routed pairs per block (the alignment's block size), >= 16.
        block_n: outputs per program, >= 16.
        block_k: inputs per loop step, >= 16.
        split_k: programs sharing one output tile's K range (down projection only).
        num_warps: warps per program.
        num_stages: software-pipelining depth.
    """

    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3


@triton.jit
def _pair_block(
    pid_m, topk_ids_ptr, expert_mask_ptr, num_experts, num_pairs, BLOCK_M: tl.constexpr
):
    """Block ``pid_m`` of the unaligned launch: routed pair ``pid_m`` alone in row 0 (the
    other rows padding, ``num_pairs``); its expert, or -1 when the pair is not in the wave
    (an id outside ``[0, E)`` or masked off)."""
    expert = tl.load(topk_ids_ptr + pid_m).to(tl.int32)
    valid = (expert >= 0) & (expert < num_experts)
    in_wave = tl.load(expert_mask_ptr + tl.where(valid, expert, 0)) != 0
    expert = tl.where(valid & in_wave, expert, -1)
    rows = tl.arange(0, BLOCK_M)
    pairs = tl.where(rows == 0, pid_m, num_pairs)
    return expert, pairs


@triton.jit
def _expert_weights(
    w_ptr, slot, stride_ws, expert, stream_w_ptr, streamed_ptr, first, STREAM: tl.constexpr
):
    """Base pointer of ``expert``'s weights: its slot, or, under ``STREAM``, its streamed
    address (``StreamedExperts``) when it holds no slot (``slot < 0``), which the expert's
    ``first`` program then flags in ``streamed_ptr``."""
    base = w_ptr + slot * stride_ws
    if STREAM:
        streamed = tl.load(stream_w_ptr + expert).to(tl.pointer_type(tl.float16))
        base = tl.where(slot >= 0, base, streamed)
        tl.store(streamed_ptr + expert, 1, mask=first & (slot < 0))
    return base


@triton.jit
def _fill_target(
    w_ptr, slot, stride_ws, expert, fill_ptr, expert_ids_ptr, pid_m, PAIR_BLOCKS: tl.constexpr
):
    """(base, on) of the fill: the base pointer of ``expert``'s fill slot (``fill_ptr``) and
    whether this program stores there (a streamed expert with a fill slot, first block)."""
    fill_slot = tl.load(fill_ptr + expert).to(tl.int64)
    on = (slot < 0) & (fill_slot >= 0)
    if not PAIR_BLOCKS:
        previous = tl.load(expert_ids_ptr + tl.maximum(pid_m - 1, 0))
        on = on & ((pid_m == 0) | (previous != expert))
    return w_ptr + tl.maximum(fill_slot, 0) * stride_ws, on


@triton.jit
def _grouped_gate_up_kernel(
    x_ptr,
    sorted_ids_ptr,
    expert_ids_ptr,
    num_post_padded_ptr,
    expert_to_slot_ptr,
    w_ptr,
    h_ptr,
    K,
    I,
    top_k,
    num_pairs,
    stride_xt,
    stride_ws,
    stride_wn,
    stride_ht,
    topk_ids_ptr,
    expert_mask_ptr,
    num_experts,
    stream_w_ptr,
    streamed_ptr,
    fill_ptr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PAIR_BLOCKS: tl.constexpr = False,
    STREAM: tl.constexpr = False,
    FILL: tl.constexpr = False,
    PDL: tl.constexpr = 0,
):
    pdl_enter(PDL)  # first: with PDL, wait for the previous kernel
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if PAIR_BLOCKS:
        expert, pairs = _pair_block(
            pid_m, topk_ids_ptr, expert_mask_ptr, num_experts, num_pairs, BLOCK_M
        )
        if expert < 0:
            return  # the pair's expert is outside the wave
    else:
        if pid_m * BLOCK_M >= tl.load(num_post_padded_ptr):
            return  # block beyond the padded length: the grid is an upper bound
        expert = tl.load(expert_ids_ptr + pid_m)
        pairs = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    slot = tl.load(expert_to_slot_ptr + expert).to(tl.int64)
    row_mask = pairs < num_pairs
    tokens = pairs // top_k
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < I
    offs_k = tl.arange(0, BLOCK_K)
    w_base = _expert_weights(
        w_ptr, slot, stride_ws, expert, stream_w_ptr, streamed_ptr, pid_n == 0, STREAM
    )
    w_gate = w_base + offs_n[None, :] * stride_wn
    w_up = w_gate + I * stride_wn
    if FILL:
        fill_base, fill_on = _fill_target(
            w_ptr, slot, stride_ws, expert, fill_ptr, expert_ids_ptr, pid_m, PAIR_BLOCKS
        )
        fill_gate = fill_base + offs_n[None, :] * stride_wn
        fill_up = fill_gate + I * stride_wn
    x_rows = x_ptr + tokens[:, None] * stride_xt
    acc_gate = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        k_mask = kk < K
        x = tl.load(x_rows + kk[None, :], mask=row_mask[:, None] & k_mask[None, :], other=0.0)
        w_mask = k_mask[:, None] & n_mask[None, :]
        gate = tl.load(w_gate + kk[:, None], mask=w_mask, other=0.0)
        up = tl.load(w_up + kk[:, None], mask=w_mask, other=0.0)
        if FILL:
            tl.store(fill_gate + kk[:, None], gate, mask=w_mask & fill_on)
            tl.store(fill_up + kk[:, None], up, mask=w_mask & fill_on)
        acc_gate = tl.dot(x, gate, acc_gate)
        acc_up = tl.dot(x, up, acc_up)
    h = acc_gate * tl.sigmoid(acc_gate) * acc_up
    tl.store(
        h_ptr + pairs[:, None] * stride_ht + offs_n[None, :],
        h.to(tl.float16),
        mask=row_mask[:, None] & n_mask[None, :],
    )


@triton.jit
def _grouped_down_kernel(
    h_ptr,
    sorted_ids_ptr,
    expert_ids_ptr,
    num_post_padded_ptr,
    expert_to_slot_ptr,
    topk_weights_ptr,
    w_ptr,
    out_ptr,
    K,
    N,
    top_k,
    num_pairs,
    k_per_split,
    stride_ht,
    stride_ws,
    stride_wn,
    stride_ot,
    topk_ids_ptr,
    expert_mask_ptr,
    num_experts,
    stream_w_ptr,
    streamed_ptr,
    fill_ptr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PER_PAIR: tl.constexpr = False,
    PAIR_BLOCKS: tl.constexpr = False,
    STREAM: tl.constexpr = False,
    FILL: tl.constexpr = False,
    PDL: tl.constexpr = 0,
):
    pdl_enter(PDL)  # first: with PDL, wait for the previous kernel
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    pid_k = tl.program_id(2)
    if PAIR_BLOCKS:
        expert, pairs = _pair_block(
            pid_m, topk_ids_ptr, expert_mask_ptr, num_experts, num_pairs, BLOCK_M
        )
        if expert < 0:
            return
    else:
        if pid_m * BLOCK_M >= tl.load(num_post_padded_ptr):
            return
        expert = tl.load(expert_ids_ptr + pid_m)
        pairs = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M))
    slot = tl.load(expert_to_slot_ptr + expert).to(tl.int64)
    row_mask = pairs < num_pairs
    tokens = pairs // top_k
    routing_weights = tl.load(topk_weights_ptr + pairs, mask=row_mask, other=0.0).to(tl.float32)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    first = (pid_n == 0) & (pid_k == 0)
    w_base = _expert_weights(
        w_ptr, slot, stride_ws, expert, stream_w_ptr, streamed_ptr, first, STREAM
    )
    w_rows = w_base + offs_n[None, :] * stride_wn
    if FILL:
        fill_base, fill_on = _fill_target(
            w_ptr, slot, stride_ws, expert, fill_ptr, expert_ids_ptr, pid_m, PAIR_BLOCKS
        )
        fill_rows = fill_base + offs_n[None, :] * stride_wn
    h_rows = h_ptr + pairs[:, None] * stride_ht
    k_begin = pid_k * k_per_split
    k_end = tl.minimum(k_begin + k_per_split, K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        kk = k0 + offs_k
        k_mask = kk < k_end
        a = tl.load(h_rows + kk[None, :], mask=row_mask[:, None] & k_mask[None, :], other=0.0)
        w_mask = k_mask[:, None] & n_mask[None, :]
        w = tl.load(w_rows + kk[:, None], mask=w_mask, other=0.0)
        if FILL:
            tl.store(fill_rows + kk[:, None], w, mask=w_mask & fill_on)
        acc = tl.dot(a, w, acc)
    if PER_PAIR:
        # out is [T, k, H]: pair t*k+j owns row t*k+j, so a plain store (one
        # program per element, no split-K) replaces the order-dependent atomics.
        tl.store(
            out_ptr + pairs.to(tl.int64)[:, None] * stride_ot + offs_n[None, :],
            acc * routing_weights[:, None],
            mask=row_mask[:, None] & n_mask[None, :],
        )
    else:
        tl.atomic_add(
            out_ptr + tokens[:, None] * stride_ot + offs_n[None, :],
            acc * routing_weights[:, None],
            mask=row_mask[:, None] & n_mask[None, :],
        )


def per_pair_configs(device: torch.device) -> tuple[GroupedConfig, GroupedConfig]:
    """(gate_up, down) tile shapes of the per-pair (batch-invariant) mode.

    One config whatever T: BLOCK_K fixes each pair's summation order, so it must
    not follow the token count, and there is no split-K.

    On the GPU the tile is 32 columns wide: a streamed expert's read over PCIe then
    spreads over twice the programs (gate_up's 2I columns in 44 programs for
    DeepSeek-V2-Lite, not 22). Measured on an
    H200: one streamed expert of 7 rows in 0.61 ms rather than 1.79 ms, three in 1.21 ms
    rather than 2.09 ms, resident experts unchanged. The K loop (BLOCK_K steps, no split) is
    the same, and still fixed whatever T. Wider K steps (16 x 256, 16 x 512, 32 x 256) read a
    lone one-row streamed expert faster but several experts or rows no faster (49-55 GB/s,
    the link's rate, with this tile).
    """
    if device.type != "cuda":
        return GroupedConfig(16, 64, 64), GroupedConfig(16, 64, 64)
    config = GroupedConfig(16, 32, 128, num_warps=4, num_stages=4)
    return config, config


def parse_per_pair_tile(value: str) -> GroupedConfig:
    """``"block_n/stages/warps/block_k"`` -> the per-pair ``GroupedConfig`` (block_m 16).

    Raises:
        ValueError: not four positive integers, or block_n / block_k below 16 or not a
            power of two (tl.dot's and tl.arange's limits).
    """
    parts = value.split("/")
    try:
        block_n, stages, warps, block_k = (int(p) for p in parts)
    except ValueError:
        raise ValueError(
            f"per-pair tile {value!r}: expected four integers "
            "block_n/stages/warps/block_k such as 32/4/4/128"
        ) from None
    for name, v in (("block_n", block_n), ("block_k", block_k)):
        if v < 16 or v & (v - 1):
            raise ValueError(f"per-pair tile {value!r}: {name} {v} must be a power of two >= 16")
    if stages < 1 or warps < 1 or warps & (warps - 1):
        raise ValueError(
            f"per-pair tile {value!r}: stages {stages} must be >= 1 and warps {warps} "
            "a power of two"
        )
    return GroupedConfig(16, block_n, block_k, num_warps=warps, num_stages=stages)


def grouped_configs(
    device: torch.device, T: int, top_k: int, E: int, H: int, I: int
) -> tuple[GroupedConfig, GroupedConfig]:
    """(gate_up, down) tile shapes; equal block_m (they share one alignment)."""
    if device.type != "cuda":
        # The interpreter's cost is per program and per op: few, large programs.
        return GroupedConfig(16, 64, 64), GroupedConfig(16, 64, 64, split_k=2)
    tokens_per_expert = T * top_k / E
    if tokens_per_expert <= 16:
        gate_up = GroupedConfig(16, 64, 128, num_warps=4, num_stages=4)
        blocks = min(T * top_k, E) + T * top_k // 16
        split = max(1, min(triton.cdiv(1024, blocks * triton.cdiv(H, 64)), triton.cdiv(I, 128)))
        return gate_up, GroupedConfig(16, 64, 128, split_k=split, num_warps=4, num_stages=4)
    block_m = 32 if tokens_per_expert <= 48 else 64
    config = GroupedConfig(block_m, 128, 64, num_warps=4, num_stages=4)
    return config, config


def launch_grouped(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13_slots: torch.Tensor,
    w2_slots: torch.Tensor,
    expert_to_slot: torch.Tensor,
    expert_mask: torch.Tensor,
    out: torch.Tensor,
    gate_up_config: GroupedConfig | None = None,
    down_config: GroupedConfig | None = None,
    pair_blocks: bool | None = None,
    streamed: StreamedExperts | None = None,
    streamed_flags: torch.Tensor | None = None,
    fill_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """Align the wave's pairs (unless ``pair_blocks``) and run both launches (arguments
    validated by the caller). With ``streamed``, experts without a slot read their
    weights from its addresses and flag ``streamed_flags [2, E]`` (gate_up, down); with
    ``fill_slots [E]`` too, each is also stored into its fill slot (-1: none).

    A per-pair ``out [T, k, H]`` always uses :func:`per_pair_configs` (given
    configs are ignored: a T-dependent tile would break batch invariance).
    """
    T, H = x.shape
    top_k = topk_ids.shape[1]
    I = w2_slots.shape[2]
    E = expert_mask.shape[0]
    num_pairs = T * top_k
    per_pair = out.dim() == 3
    if per_pair:
        gate_up_config, down_config = per_pair_configs(x.device)
    elif gate_up_config is None or down_config is None:
        gate_up_config, down_config = grouped_configs(x.device, T, top_k, E, H, I)
    if gate_up_config.block_m != down_config.block_m:
        raise ValueError("gate_up and down configs must share block_m")
    block_m = gate_up_config.block_m
    mask = expert_mask.view(torch.uint8)  # bool loads as plain bytes
    ids = topk_ids.contiguous().view(-1)
    # One routed row: its pairs have distinct experts, so sorting them by expert shares no
    # weight read and each pair is its own block, with no alignment launch. A pair's result
    # does not depend on its row in a block, so the bits are those of the aligned launch.
    if pair_blocks is None:
        pair_blocks = T == 1
    fill = fill_slots is not None
    if fill and pair_blocks and T > 1:
        raise ValueError(
            f"fill_slots with pair_blocks needs one row (its pairs have distinct experts, so "
            f"each expert has one block to fill from), got {T} rows: align them instead"
        )
    if pair_blocks:
        sorted_ids = expert_ids = num_post_padded = ids  # unread under PAIR_BLOCKS
        max_blocks = num_pairs
    else:
        sorted_ids, expert_ids, num_post_padded = moe_align_block_size(
            topk_ids, E, block_m, expert_mask=expert_mask
        )
        max_blocks = max_aligned_blocks(num_pairs, E, block_m)
    h = torch.empty(num_pairs, I, dtype=torch.float16, device=x.device)
    stream = streamed is not None
    if stream:
        addresses = (streamed.w13_addresses, streamed.w2_addresses)
        flags = (streamed_flags[0], streamed_flags[1])
    else:
        addresses = flags = (ids, ids)  # unread without STREAM
    fills = fill_slots if fill else ids  # unread without FILL
    c = gate_up_config
    _grouped_gate_up_kernel[(max_blocks, triton.cdiv(I, c.block_n))](
        x, sorted_ids, expert_ids, num_post_padded, expert_to_slot, w13_slots, h,
        H, I, top_k, num_pairs,
        x.stride(0), w13_slots.stride(0), w13_slots.stride(1), h.stride(0), ids, mask, E,
        addresses[0], flags[0], fills,
        BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, PAIR_BLOCKS=pair_blocks,
        STREAM=stream, FILL=fill, num_warps=c.num_warps, num_stages=c.num_stages,
        **pdl_options(x.device),
    )  # fmt: skip
    c = down_config
    per_split = triton.cdiv(triton.cdiv(I, c.split_k), c.block_k) * c.block_k
    splits = triton.cdiv(I, per_split)
    _grouped_down_kernel[(max_blocks, triton.cdiv(H, c.block_n), splits)](
        h, sorted_ids, expert_ids, num_post_padded, expert_to_slot, topk_weights.reshape(-1),
        w2_slots, out,
        I, H, top_k, num_pairs, per_split,
        h.stride(0), w2_slots.stride(0), w2_slots.stride(1), out.stride(-2), ids, mask, E,
        addresses[1], flags[1], fills,
        BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, PER_PAIR=per_pair,
        PAIR_BLOCKS=pair_blocks, STREAM=stream, FILL=fill, num_warps=c.num_warps,
        num_stages=c.num_stages,
        **pdl_options(h.device),
    )  # fmt: skip
    return out
