"""Triton GEMV kernels of the grouped FP16 expert layer, for decode-sized waves.

The tensor-core kernels of :mod:`specter_kernels.grouped_fp16_triton` multiply a block of at
least 16 routed pairs by an expert's weights in K steps. At one routed row (plain decoding)
or a few (a verification), a block holds one or two real pairs: the time is the expert
weights' bytes, and a K loop of MMA steps keeps fewer of them in flight than a GEMV would.
These kernels are GEMVs over the routed pairs instead, in the manner of
:mod:`specter_kernels.invariant_gemv_triton`:

* one program owns ``BLOCK_N`` output columns of one expert and all of K: it loads its
  ``[BLOCK_N, K]`` stretch of the expert's weights (gate and up: two of them) in one go,
  every load in flight at once, into registers as fp32;
* then it takes its block's pairs one after the other (a runtime count, never specialised):
  for each it loads the pair's input row, multiplies elementwise, sums along K with one
  ``tl.sum``, and stores (gate_up: ``silu(gate) * up`` rounded to fp16; down: times the
  routing weight, fp32, into the per-pair output or added into the accumulator).

Every pair goes through the same instructions whatever the pairs beside it and however many
the launch has, so a pair's bits do not depend on the row count: the per-pair (batch-
invariant) mode holds by construction. The tile (``BLOCK_N``, warps) depends on the weight's
shape only (:func:`grouped_gemv_configs`).

Blocks are as in the tensor-core launch: ``PAIR_BLOCKS`` gives program ``p`` routed pair
``p`` alone (one routed row, whose pairs have distinct experts); otherwise pairs sorted by
expert (``moe_align_block_size``) in blocks of ``BLOCK_M``, the weights loaded once a block.
``STREAM`` and ``FILL`` work as there: an expert without a slot is read from its streamed
address, and with a fill slot its first block stores every tile it loaded into that slot.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from specter_kernels.grouped_fp16_triton import _expert_weights, _fill_target
from specter_kernels.moe_align import max_aligned_blocks, moe_align_block_size
from specter_kernels.pdl import pdl_enter, pdl_options
from specter_kernels.streamed_experts import StreamedExperts

GEMV_BLOCK_M = 16
"""Routed pairs per aligned block (several rows): the weights are loaded once a block."""


@dataclass(frozen=True)
class GroupedGemvConfig:
    """Tile of one grouped GEMV launch.

    Attributes:
        block_n: output columns per program, a power of two.
        num_warps: warps per program.
    """

    block_n: int
    num_warps: int = 4

    def __post_init__(self) -> None:
        if self.block_n < 1 or self.block_n & (self.block_n - 1):
            raise ValueError(f"block_n must be a power of two, got {self.block_n}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be 1, 2, 4, 8 or 16, got {self.num_warps}")


@triton.jit
def _block_pairs(
    pid_m,
    sorted_ids_ptr,
    expert_ids_ptr,
    num_post_padded_ptr,
    topk_ids_ptr,
    expert_mask_ptr,
    num_experts,
    num_pairs,
    BLOCK_M: tl.constexpr,
    PAIR_BLOCKS: tl.constexpr,
):
    """(expert, first, count) of block ``pid_m``: its expert (-1: nothing to do), the index
    of its first pair in ``sorted_ids`` (unused under ``PAIR_BLOCKS``) and its pair count.
    An aligned block's real pairs come first (the alignment pads each expert's run)."""
    if PAIR_BLOCKS:
        expert = tl.load(topk_ids_ptr + pid_m).to(tl.int32)
        valid = (expert >= 0) & (expert < num_experts)
        in_wave = tl.load(expert_mask_ptr + tl.where(valid, expert, 0)) != 0
        expert = tl.where(valid & in_wave, expert, -1)
        count = 1
    else:
        live = pid_m * BLOCK_M < tl.load(num_post_padded_ptr)
        expert = tl.where(live, tl.load(expert_ids_ptr + pid_m, mask=live, other=-1), -1)
        pairs = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M), mask=live,
                        other=num_pairs)  # fmt: skip
        count = tl.sum((pairs < num_pairs).to(tl.int32), axis=0)
    return expert, pid_m * BLOCK_M, count


@triton.jit
def _pair_of(r, pid_m, first, sorted_ids_ptr, PAIR_BLOCKS: tl.constexpr):
    """The routed pair at position ``r`` of the block."""
    if PAIR_BLOCKS:
        return pid_m
    return tl.load(sorted_ids_ptr + first + r)


@triton.jit(do_not_specialize=["top_k", "num_pairs", "stride_xt", "stride_ht"])
def _grouped_gemv_gate_up_kernel(
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
    expert, first, count = _block_pairs(
        pid_m, sorted_ids_ptr, expert_ids_ptr, num_post_padded_ptr, topk_ids_ptr,
        expert_mask_ptr, num_experts, num_pairs, BLOCK_M, PAIR_BLOCKS,
    )  # fmt: skip
    if expert < 0:
        return  # outside the wave, or a block past the padded length
    slot = tl.load(expert_to_slot_ptr + expert).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask = offs_n < I
    w_mask = n_mask[:, None] & (offs_k < K)[None, :]
    w_base = _expert_weights(
        w_ptr, slot, stride_ws, expert, stream_w_ptr, streamed_ptr, pid_n == 0, STREAM
    )
    tile = offs_n.to(tl.int64)[:, None] * stride_wn + offs_k[None, :]
    gate = tl.load(w_base + tile, mask=w_mask, other=0.0)
    up = tl.load(w_base + I * stride_wn + tile, mask=w_mask, other=0.0)
    if FILL:
        fill_base, fill_on = _fill_target(
            w_ptr, slot, stride_ws, expert, fill_ptr, expert_ids_ptr, pid_m, PAIR_BLOCKS
        )
        tl.store(fill_base + tile, gate, mask=w_mask & fill_on)
        tl.store(fill_base + I * stride_wn + tile, up, mask=w_mask & fill_on)
    gate = gate.to(tl.float32)
    up = up.to(tl.float32)
    for r in range(0, BLOCK_M):
        if r < count:  # the block's real pairs come first
            pair = _pair_of(r, pid_m, first, sorted_ids_ptr, PAIR_BLOCKS)
            row = tl.multiple_of((pair // top_k) * stride_xt, 8)  # the launcher's contract
            x = tl.load(x_ptr + row + offs_k, mask=offs_k < K, other=0.0).to(tl.float32)
            g = tl.sum(gate * x[None, :], axis=1)
            u = tl.sum(up * x[None, :], axis=1)
            h = g * tl.sigmoid(g) * u
            tl.store(h_ptr + pair * stride_ht + offs_n, h.to(tl.float16), mask=n_mask)


@triton.jit(do_not_specialize=["top_k", "num_pairs", "stride_ht", "stride_ot"])
def _grouped_gemv_down_kernel(
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
    expert, first, count = _block_pairs(
        pid_m, sorted_ids_ptr, expert_ids_ptr, num_post_padded_ptr, topk_ids_ptr,
        expert_mask_ptr, num_experts, num_pairs, BLOCK_M, PAIR_BLOCKS,
    )  # fmt: skip
    if expert < 0:
        return
    slot = tl.load(expert_to_slot_ptr + expert).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask = offs_n < N
    k_mask = offs_k < K
    w_mask = n_mask[:, None] & k_mask[None, :]
    w_base = _expert_weights(
        w_ptr, slot, stride_ws, expert, stream_w_ptr, streamed_ptr, pid_n == 0, STREAM
    )
    tile = offs_n.to(tl.int64)[:, None] * stride_wn + offs_k[None, :]
    w = tl.load(w_base + tile, mask=w_mask, other=0.0)
    if FILL:
        fill_base, fill_on = _fill_target(
            w_ptr, slot, stride_ws, expert, fill_ptr, expert_ids_ptr, pid_m, PAIR_BLOCKS
        )
        tl.store(fill_base + tile, w, mask=w_mask & fill_on)
    w = w.to(tl.float32)
    for r in range(0, BLOCK_M):
        if r < count:
            pair = _pair_of(r, pid_m, first, sorted_ids_ptr, PAIR_BLOCKS)
            row = tl.multiple_of(pair * stride_ht, 8)  # the launcher's contract
            a = tl.load(h_ptr + row + offs_k, mask=k_mask, other=0.0).to(tl.float32)
            y = tl.sum(w * a[None, :], axis=1)
            y = y * tl.load(topk_weights_ptr + pair).to(tl.float32)
            if PER_PAIR:
                tl.store(out_ptr + pair.to(tl.int64) * stride_ot + offs_n, y, mask=n_mask)
            else:
                tl.atomic_add(out_ptr + (pair // top_k).to(tl.int64) * stride_ot + offs_n, y,
                              mask=n_mask)  # fmt: skip


def grouped_gemv_configs(H: int, I: int) -> tuple[GroupedGemvConfig, GroupedGemvConfig]:
    """(gate_up, down) tiles of an expert of hidden size ``H`` and intermediate ``I``: about
    64 weight elements a thread (gate_up holds two tiles), 4 warps (8 for rows of 8192
    elements or more)."""
    configs = []
    for tiles, k in ((2, H), (1, I)):
        width = triton.next_power_of_2(k)
        warps = 8 if width >= 8192 else 4
        block_n = max(1, min(8, 64 * 32 * warps // (tiles * width)))
        configs.append(GroupedGemvConfig(block_n, warps))
    return configs[0], configs[1]


def launch_grouped_gemv(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13_slots: torch.Tensor,
    w2_slots: torch.Tensor,
    expert_to_slot: torch.Tensor,
    expert_mask: torch.Tensor,
    out: torch.Tensor,
    gate_up_config: GroupedGemvConfig | None = None,
    down_config: GroupedGemvConfig | None = None,
    pair_blocks: bool | None = None,
    streamed: StreamedExperts | None = None,
    streamed_flags: torch.Tensor | None = None,
    fill_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """The GEMV form of :func:`~specter_kernels.grouped_fp16_triton.launch_grouped` (same
    arguments, validated by the caller; ``out`` fp32 ``[T, H]`` accumulated into with
    atomics, or ``[T, k, H]`` per pair, stored). Rows of ``x`` and of the intermediate
    must be 16-byte aligned (``H`` and ``I`` multiples of 8): ``x`` is copied otherwise."""
    T, H = x.shape
    top_k = topk_ids.shape[1]
    I = w2_slots.shape[2]
    E = expert_mask.shape[0]
    num_pairs = T * top_k
    if H % 8 or I % 8:
        raise ValueError(f"the grouped GEMV needs H and I multiples of 8, got H={H}, I={I}")
    if x.stride(-1) != 1 or x.stride(0) % 8 or x.data_ptr() % 16:
        x = x.clone(memory_format=torch.contiguous_format)
    if gate_up_config is None or down_config is None:
        gate_up_config, down_config = grouped_gemv_configs(H, I)
    mask = expert_mask.view(torch.uint8)
    ids = topk_ids.contiguous().view(-1)
    if pair_blocks is None:
        pair_blocks = T == 1
    fill = fill_slots is not None
    if fill and pair_blocks and T > 1:
        raise ValueError(
            f"fill_slots with pair_blocks needs one row (its pairs have distinct experts, so "
            f"each expert has one block to fill from), got {T} rows: align them instead"
        )
    if pair_blocks:
        block_m = 1
        sorted_ids = expert_ids = num_post_padded = ids  # unread under PAIR_BLOCKS
        max_blocks = num_pairs
    else:
        block_m = GEMV_BLOCK_M
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
    _grouped_gemv_gate_up_kernel[(max_blocks, triton.cdiv(I, c.block_n))](
        x, sorted_ids, expert_ids, num_post_padded, expert_to_slot, w13_slots, h,
        H, I, top_k, num_pairs,
        x.stride(0), w13_slots.stride(0), w13_slots.stride(1), h.stride(0), ids, mask, E,
        addresses[0], flags[0], fills,
        BLOCK_M=block_m, BLOCK_N=c.block_n, BLOCK_K=triton.next_power_of_2(H),
        PAIR_BLOCKS=pair_blocks, STREAM=stream, FILL=fill, num_warps=c.num_warps,
        num_stages=1, **pdl_options(x.device),
    )  # fmt: skip
    c = down_config
    _grouped_gemv_down_kernel[(max_blocks, triton.cdiv(H, c.block_n))](
        h, sorted_ids, expert_ids, num_post_padded, expert_to_slot, topk_weights.reshape(-1),
        w2_slots, out,
        I, H, top_k, num_pairs,
        h.stride(0), w2_slots.stride(0), w2_slots.stride(1), out.stride(-2), ids, mask, E,
        addresses[1], flags[1], fills,
        BLOCK_M=block_m, BLOCK_N=c.block_n, BLOCK_K=triton.next_power_of_2(I),
        PER_PAIR=out.dim() == 3, PAIR_BLOCKS=pair_blocks, STREAM=stream, FILL=fill,
        num_warps=c.num_warps, num_stages=1, **pdl_options(h.device),
    )  # fmt: skip
    return out
