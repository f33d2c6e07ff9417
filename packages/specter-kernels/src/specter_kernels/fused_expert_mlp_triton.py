"""Triton kernels of the fused per-pair expert MLP: gate/up, SwiGLU and a slice of down in one
launch, then the slices' fixed-order sum.

The per-pair (batch-invariant) routed experts run as two weight-streaming launches, gate_up
then down (``grouped_fp16_triton``), and each pays its own ramp and drain of the memory
pipeline. Here program ``(block, c)`` takes ``BLOCK_I`` intermediate columns ``c`` of its
block's expert: it computes ``h[:, c] = silu(x W_gate[c]^T) * (x W_up[c]^T)`` over the whole
hidden size (rounded to fp16 as the gate_up launch rounds), then at once multiplies that
slice by the matching ``BLOCK_I`` columns of the down projection, ``part[p, c] = h[:, c]
W_down[:, c]^T`` (fp32 ``[H]`` a pair), so the whole expert streams through one launch and
nothing waits for a grid-wide intermediate. A second, small launch adds each pair's
``C = ceil(I / BLOCK_I)`` slices in order ``c = 0 .. C-1`` and multiplies by the routing
weight: ``out[t, j] = (sum_c part[p, c]) * w[p]``.

A pair's slices, and their order, depend on nothing but the pair (no split over rows, one
tile config whatever T), so the result is deterministic and the same for a row whatever
rows share the launch. The summation order differs from the two-launch path's (which sums
the down projection over all of I inside one dot), so the bits are not that path's: a
model picks one path for a whole load (see ``grouped_moe_fp16(fused=...)``).

``PAIR_BLOCKS`` and ``STREAM`` behave as in ``grouped_fp16_triton``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from specter_kernels.grouped_fp16_triton import _expert_weights, _pair_block
from specter_kernels.moe_align import max_aligned_blocks, moe_align_block_size
from specter_kernels.pdl import pdl_enter, pdl_options
from specter_kernels.streamed_experts import StreamedExperts


@dataclass(frozen=True)
class FusedMLPConfig:
    """Tile shape of the fused per-pair expert MLP.

    Attributes:
        block_m: routed pairs per block (the alignment's block size), >= 16.
        block_i: intermediate columns per program (the down projection's slice), >= 16.
        block_k: hidden inputs per gate/up loop step, >= 16.
        block_h: hidden outputs per down loop step, >= 16.
        num_warps: warps per program.
        num_stages: software-pipelining depth.
        reduce_block: hidden columns per program of the slices' sum.
    """

    block_m: int = 16
    block_i: int = 64
    block_k: int = 128
    block_h: int = 128
    num_warps: int = 4
    num_stages: int = 3
    reduce_block: int = 256


def fused_mlp_config(device: torch.device) -> FusedMLPConfig:
    """The one tile config of the fused path (fixed whatever T: it fixes the bits)."""
    if device.type != "cuda":
        return FusedMLPConfig(16, 32, 64, 64, reduce_block=64)
    return _CONFIG_OVERRIDE or FusedMLPConfig()


_CONFIG_OVERRIDE: FusedMLPConfig | None = None


def num_slices(I: int, config: FusedMLPConfig) -> int:
    """``C``: the intermediate slices a pair's down projection is summed over."""
    return triton.cdiv(I, config.block_i)


@triton.jit
def _fused_expert_mlp_kernel(
    x_ptr, sorted_ids_ptr, expert_ids_ptr, num_post_padded_ptr, expert_to_slot_ptr,
    w13_ptr, w2_ptr, part_ptr,
    H, I, top_k, num_pairs,
    stride_xt, stride_w13s, stride_w13n, stride_w2s, stride_w2n, stride_pp, stride_pc,
    topk_ids_ptr, expert_mask_ptr, num_experts, stream_w13_ptr, stream_w2_ptr, streamed_ptr,
    BLOCK_M: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_H: tl.constexpr, PAIR_BLOCKS: tl.constexpr = False, STREAM: tl.constexpr = False,
    PDL: tl.constexpr = 0,
):  # fmt: skip
    pdl_enter(PDL)  # first: with PDL, wait for the previous kernel
    pid_m = tl.program_id(0)
    pid_c = tl.program_id(1)
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
    offs_i = pid_c * BLOCK_I + tl.arange(0, BLOCK_I)
    i_mask = offs_i < I
    offs_k = tl.arange(0, BLOCK_K)
    first = pid_c == 0
    w13_base = _expert_weights(
        w13_ptr, slot, stride_w13s, expert, stream_w13_ptr, streamed_ptr, first, STREAM
    )
    w2_base = _expert_weights(
        w2_ptr, slot, stride_w2s, expert, stream_w2_ptr, streamed_ptr + num_experts, first,
        STREAM,
    )  # fmt: skip
    w_gate = w13_base + offs_i[None, :] * stride_w13n
    w_up = w_gate + I * stride_w13n
    x_rows = x_ptr + tokens[:, None] * stride_xt
    acc_gate = tl.zeros([BLOCK_M, BLOCK_I], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_I], dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        kk = k0 + offs_k
        k_mask = kk < H
        x = tl.load(x_rows + kk[None, :], mask=row_mask[:, None] & k_mask[None, :], other=0.0)
        w_mask = k_mask[:, None] & i_mask[None, :]
        gate = tl.load(w_gate + kk[:, None], mask=w_mask, other=0.0)
        up = tl.load(w_up + kk[:, None], mask=w_mask, other=0.0)
        acc_gate = tl.dot(x, gate, acc_gate)
        acc_up = tl.dot(x, up, acc_up)
    h = (acc_gate * tl.sigmoid(acc_gate) * acc_up).to(tl.float16)  # the gate_up launch's h
    offs_h = tl.arange(0, BLOCK_H)
    w_down = w2_base + offs_i[:, None]  # [BLOCK_I, BLOCK_H] tiles of W_down^T
    part_rows = part_ptr + pairs.to(tl.int64)[:, None] * stride_pp + pid_c * stride_pc
    for n0 in range(0, H, BLOCK_H):
        nn = n0 + offs_h
        n_mask = nn < H
        w = tl.load(w_down + nn[None, :] * stride_w2n, mask=i_mask[:, None] & n_mask[None, :],
                    other=0.0)  # fmt: skip
        acc = tl.dot(h, w)
        tl.store(part_rows + nn[None, :], acc, mask=row_mask[:, None] & n_mask[None, :])


@triton.jit
def _slice_sum_kernel(
    part_ptr, topk_ids_ptr, topk_weights_ptr, expert_mask_ptr, out_ptr, H, num_experts,
    stride_pp, stride_pc, stride_op,
    SLICES: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr = 0,
):  # fmt: skip
    pdl_enter(PDL)
    pair = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    keep = cols < H
    expert = tl.load(topk_ids_ptr + pair).to(tl.int32)
    valid = (expert >= 0) & (expert < num_experts)
    in_wave = tl.load(expert_mask_ptr + tl.where(valid, expert, 0)) != 0
    if valid & in_wave:  # pairs outside the wave keep their row
        first = part_ptr + pair * stride_pp + cols
        total = tl.load(first, mask=keep, other=0.0)
        for c in tl.static_range(1, SLICES):
            total += tl.load(first + c * stride_pc, mask=keep, other=0.0)
        weight = tl.load(topk_weights_ptr + pair).to(tl.float32)
        tl.store(out_ptr + pair * stride_op + cols, total * weight, mask=keep)


def launch_fused_per_pair(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13_slots: torch.Tensor,
    w2_slots: torch.Tensor,
    expert_to_slot: torch.Tensor,
    expert_mask: torch.Tensor,
    out: torch.Tensor,
    pair_blocks: bool | None = None,
    streamed: StreamedExperts | None = None,
    streamed_flags: torch.Tensor | None = None,
    config: FusedMLPConfig | None = None,
) -> torch.Tensor:
    """The fused per-pair launch and the slices' sum into ``out [T, k, H]`` (arguments
    validated by the caller; ``streamed_flags`` given whenever ``streamed`` is)."""
    T, H = x.shape
    top_k = topk_ids.shape[1]
    I = w2_slots.shape[2]
    E = expert_mask.shape[0]
    num_pairs = T * top_k
    c = config or fused_mlp_config(x.device)
    mask = expert_mask.view(torch.uint8)
    ids = topk_ids.contiguous().view(-1)
    if pair_blocks is None:
        pair_blocks = T == 1
    if pair_blocks:
        sorted_ids = expert_ids = num_post_padded = ids  # unread under PAIR_BLOCKS
        max_blocks = num_pairs
    else:
        sorted_ids, expert_ids, num_post_padded = moe_align_block_size(
            topk_ids, E, c.block_m, expert_mask=expert_mask
        )
        max_blocks = max_aligned_blocks(num_pairs, E, c.block_m)
    slices = num_slices(I, c)
    part = torch.empty(num_pairs, slices, H, dtype=torch.float32, device=x.device)
    stream = streamed is not None
    if stream:
        a13, a2, flags = streamed.w13_addresses, streamed.w2_addresses, streamed_flags
    else:
        a13 = a2 = flags = ids  # unread without STREAM
    _fused_expert_mlp_kernel[(max_blocks, slices)](
        x, sorted_ids, expert_ids, num_post_padded, expert_to_slot, w13_slots, w2_slots, part,
        H, I, top_k, num_pairs,
        x.stride(0), w13_slots.stride(0), w13_slots.stride(1), w2_slots.stride(0),
        w2_slots.stride(1), part.stride(0), part.stride(1), ids, mask, E, a13, a2, flags,
        BLOCK_M=c.block_m, BLOCK_I=c.block_i, BLOCK_K=c.block_k, BLOCK_H=c.block_h,
        PAIR_BLOCKS=pair_blocks, STREAM=stream, num_warps=c.num_warps,
        num_stages=c.num_stages, **pdl_options(x.device),
    )  # fmt: skip
    block = min(c.reduce_block, triton.next_power_of_2(H))
    _slice_sum_kernel[(num_pairs, triton.cdiv(H, block))](
        part, ids, topk_weights.reshape(-1), mask, out, H, E,
        part.stride(0), part.stride(1), out.stride(1),
        SLICES=slices, BLOCK=block, num_warps=4, **pdl_options(x.device, early_trigger=True),
    )  # fmt: skip
    return out
