"""Triton kernel of :func:`specter_kernels.moe.align.moe_align_block_size`.

One program does the whole alignment: at decode sizes (a few hundred pairs)
one launch of one program beats any multi-kernel scan. It makes two passes over
the pairs in chunks: the first counts pairs per expert, the second scatters each
pair to ``start[expert] + rank``, where the rank comes from a cumulative sum of
the chunk's one-hot expert matrix ``[CHUNK, E]``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specter_kernels.pdl import pdl_enter, pdl_options


@triton.jit
def _chunk_one_hot(
    topk_ids_ptr,
    expert_mask_ptr,
    start,
    num_pairs,
    num_experts,
    CHUNK: tl.constexpr,
    E_PAD: tl.constexpr,
    HAS_MASK: tl.constexpr,
):
    """Pair indices ``[CHUNK]`` and their one-hot experts ``[CHUNK, E_PAD]`` (int32)."""
    pairs = start + tl.arange(0, CHUNK)
    in_range = pairs < num_pairs
    ids = tl.load(topk_ids_ptr + pairs, mask=in_range, other=-1).to(tl.int32)
    keep = in_range & (ids >= 0) & (ids < num_experts)
    if HAS_MASK:
        chosen = tl.load(expert_mask_ptr + ids, mask=keep, other=0)
        keep = keep & (chosen != 0)
    experts = tl.arange(0, E_PAD)
    one_hot = ((ids[:, None] == experts[None, :]) & keep[:, None]).to(tl.int32)
    return pairs, one_hot


@triton.jit
def _moe_align_kernel(
    topk_ids_ptr,
    expert_mask_ptr,
    sorted_ids_ptr,
    expert_ids_ptr,
    num_post_padded_ptr,
    num_pairs,
    num_experts,
    max_blocks,
    BLOCK_SIZE: tl.constexpr,
    E_PAD: tl.constexpr,
    CHUNK: tl.constexpr,
    HAS_MASK: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    pdl_enter(PDL)  # first: with PDL, wait for the previous kernel
    counts = tl.zeros([E_PAD], dtype=tl.int32)
    for start in range(0, num_pairs, CHUNK):
        _, one_hot = _chunk_one_hot(
            topk_ids_ptr, expert_mask_ptr, start, num_pairs, num_experts, CHUNK, E_PAD, HAS_MASK
        )
        counts += tl.sum(one_hot, axis=0)
    padded = (counts + BLOCK_SIZE - 1) // BLOCK_SIZE * BLOCK_SIZE
    ends = tl.cumsum(padded, axis=0)
    total = tl.sum(padded, axis=0)
    tl.store(num_post_padded_ptr, total)

    # Padding value first; the scatter below overwrites the real entries.
    max_padded = max_blocks * BLOCK_SIZE
    for start in range(0, max_padded, CHUNK * 4):
        offs = start + tl.arange(0, CHUNK * 4)
        tl.store(
            sorted_ids_ptr + offs,
            tl.zeros([CHUNK * 4], dtype=tl.int32) + num_pairs,
            mask=offs < max_padded,
        )
    for start in range(0, max_blocks, CHUNK):
        blocks = start + tl.arange(0, CHUNK)
        first_row = blocks * BLOCK_SIZE
        # The owner of a block is the number of experts whose padded run ends at or before it.
        owner = tl.sum((ends[None, :] <= first_row[:, None]).to(tl.int32), axis=1)
        owner = tl.where(first_row < total, owner, -1)
        tl.store(expert_ids_ptr + blocks, owner, mask=blocks < max_blocks)
    # Make the padding stores of every thread land before the scatter's.
    tl.debug_barrier()

    next_free = ends - padded
    for start in range(0, num_pairs, CHUNK):
        pairs, one_hot = _chunk_one_hot(
            topk_ids_ptr, expert_mask_ptr, start, num_pairs, num_experts, CHUNK, E_PAD, HAS_MASK
        )
        rank = tl.cumsum(one_hot, axis=0) - one_hot  # earlier pairs of the same expert
        dest = tl.sum(one_hot * (next_free[None, :] + rank), axis=1)
        kept = tl.sum(one_hot, axis=1) > 0
        tl.store(sorted_ids_ptr + dest, pairs, mask=kept)
        next_free += tl.sum(one_hot, axis=0)


def moe_align_block_size_triton(
    topk_ids: torch.Tensor,
    num_experts: int,
    block_size: int,
    expert_mask: torch.Tensor | None,
    max_blocks: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the alignment kernel (arguments as in ``moe_align_block_size``; ``max_blocks``
    from ``max_aligned_blocks``)."""
    device = topk_ids.device
    num_pairs = topk_ids.numel()
    sorted_ids = torch.empty(max_blocks * block_size, dtype=torch.int32, device=device)
    expert_ids = torch.empty(max_blocks, dtype=torch.int32, device=device)
    num_post_padded = torch.empty(1, dtype=torch.int32, device=device)
    e_pad = triton.next_power_of_2(num_experts)
    chunk = max(16, min(256, 4096 // e_pad))
    # A bool tensor viewed as uint8 costs nothing and loads as plain bytes.
    mask = expert_mask.view(torch.uint8) if expert_mask is not None else topk_ids
    _moe_align_kernel[(1,)](
        topk_ids.contiguous(),
        mask,
        sorted_ids,
        expert_ids,
        num_post_padded,
        num_pairs,
        num_experts,
        max_blocks,
        BLOCK_SIZE=block_size,
        E_PAD=e_pad,
        CHUNK=chunk,
        HAS_MASK=expert_mask is not None,
        num_warps=4,
        **pdl_options(topk_ids.device),
    )
    return sorted_ids, expert_ids, num_post_padded
