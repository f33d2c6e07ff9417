"""Token-to-expert alignment: routed (token, slot) pairs sorted by expert, padded per expert.

Terms:

* pair: one (token t, top-k slot j) of ``topk_ids [T, k]``, named by its flat index
  ``p = t * k + j``. There are ``P = T * k`` pairs; ``P`` itself is the padding value.
* block: ``block_size`` consecutive entries of ``sorted_token_ids``, all routed to
  one expert, so a kernel program can multiply them by that expert's weights.

The outputs have static sizes computed on the host from (P, E, block_size) alone,
so nothing waits for the device: at most ``max_blocks = (P + min(P, E) * (bs - 1))
// bs`` blocks exist (each non-empty expert wastes at most ``bs - 1`` slots), and
kernels launched over ``max_blocks`` exit early from blocks at or beyond
``num_tokens_post_padded``.
"""

from __future__ import annotations

import torch

from specter_kernels.backend import select_backend


def max_aligned_blocks(num_pairs: int, num_experts: int, block_size: int) -> int:
    """Upper bound on the number of blocks, from host-known sizes only (at least 1)."""
    bound = (num_pairs + min(num_pairs, num_experts) * (block_size - 1)) // block_size
    return max(bound, 1)


def _check_args(
    topk_ids: torch.Tensor, num_experts: int, block_size: int, expert_mask: torch.Tensor | None
) -> None:
    if topk_ids.dim() != 2:
        raise ValueError(f"topk_ids must be [T, k], got shape {tuple(topk_ids.shape)}")
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"topk_ids must be int32 or int64, got {topk_ids.dtype}")
    if num_experts < 1:
        raise ValueError(f"num_experts must be >= 1, got {num_experts}")
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    if expert_mask is not None:
        if expert_mask.dtype != torch.bool or tuple(expert_mask.shape) != (num_experts,):
            raise ValueError(
                f"expert_mask must be bool [{num_experts}], got {expert_mask.dtype} "
                f"{tuple(expert_mask.shape)}"
            )
        if expert_mask.device != topk_ids.device:
            raise ValueError(
                f"expert_mask is on {expert_mask.device} but topk_ids on {topk_ids.device}"
            )


def moe_align_block_size(
    topk_ids: torch.Tensor,
    num_experts: int,
    block_size: int,
    *,
    expert_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sort routed pairs by expert and pad each expert's run to a multiple of block_size.

    No host synchronisation: all outputs stay on topk_ids' device and their sizes
    depend on shapes only. Within an expert, pairs keep ascending pair order.

    Args:
        topk_ids: int ``[T, k]`` expert of each (token, slot). Ids outside
            ``[0, num_experts)`` are skipped.
        num_experts: E.
        block_size: rows per block (the kernels' BLOCK_M).
        expert_mask: optional bool ``[E]``; pairs routed to experts where it is False
            are skipped (used to compute only the experts resident now).

    Returns:
        ``(sorted_token_ids, expert_ids, num_tokens_post_padded)``:

        * ``sorted_token_ids`` int32 ``[max_blocks * block_size]``: pair indices
          ``t * k + j`` grouped by expert; padding and unused tail hold ``T * k``.
        * ``expert_ids`` int32 ``[max_blocks]``: the expert of each block; -1 for
          blocks at or beyond ``num_tokens_post_padded``.
        * ``num_tokens_post_padded`` int32 ``[1]``: the padded length actually used.

    Raises:
        ValueError, TypeError: bad shapes or dtypes.
    """
    _check_args(topk_ids, num_experts, block_size, expert_mask)
    if select_backend(topk_ids.device) == "torch":
        return moe_align_block_size_reference(
            topk_ids, num_experts, block_size, expert_mask=expert_mask
        )
    from specter_kernels.moe.align_triton import moe_align_block_size_triton

    max_blocks = max_aligned_blocks(topk_ids.numel(), num_experts, block_size)
    return moe_align_block_size_triton(topk_ids, num_experts, block_size, expert_mask, max_blocks)


def moe_align_block_size_reference(
    topk_ids: torch.Tensor,
    num_experts: int,
    block_size: int,
    *,
    expert_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Torch reference of :func:`moe_align_block_size` (same outputs, also sync-free)."""
    _check_args(topk_ids, num_experts, block_size, expert_mask)
    device = topk_ids.device
    flat = topk_ids.reshape(-1).to(torch.int64)
    P = flat.numel()
    max_blocks = max_aligned_blocks(P, num_experts, block_size)
    valid = (flat >= 0) & (flat < num_experts)
    if expert_mask is not None:
        valid &= expert_mask[flat.clamp(0, num_experts - 1)]
    key = torch.where(valid, flat, num_experts)  # skipped pairs sort last, into bucket E
    order = torch.argsort(key, stable=True)
    counts = torch.zeros(num_experts + 1, dtype=torch.int64, device=device)
    counts.scatter_add_(0, key, torch.ones_like(key))
    counts = counts[:num_experts]
    padded = (counts + block_size - 1) // block_size * block_size
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    first_sorted = torch.cumsum(counts, 0) - counts  # where each expert starts in `order`
    sorted_key = key[order]
    expert_of = sorted_key.clamp(max=num_experts - 1)
    rank = torch.arange(P, device=device) - first_sorted[expert_of]
    dump = max_blocks * block_size  # one extra slot swallows skipped pairs
    dest = torch.where(sorted_key < num_experts, starts[expert_of] + rank, dump)
    sorted_ids = torch.full((dump + 1,), P, dtype=torch.int32, device=device)
    sorted_ids.scatter_(0, dest, order.to(torch.int32))
    block_start = torch.arange(max_blocks, device=device) * block_size
    owner = torch.searchsorted(ends, block_start, right=True)
    total = ends[-1:]
    expert_ids = torch.where(block_start < total, owner, -1).to(torch.int32)
    return sorted_ids[:dump], expert_ids, total.to(torch.int32)
