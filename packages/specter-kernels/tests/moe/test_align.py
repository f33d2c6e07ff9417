"""Token-to-expert alignment: the Triton kernel against the reference, and its invariants."""

import pytest
import torch

import specter_kernels as sk
from kernel_helpers import random_routing


def check_invariants(topk_ids, num_experts, block_size, result, expert_mask=None):
    """Every routed (kept) pair appears once, in its expert's block, in ascending order."""
    sorted_ids, expert_ids, num_post_padded = result
    P = topk_ids.numel()
    flat = topk_ids.reshape(-1).long()
    keep = (flat >= 0) & (flat < num_experts)
    if expert_mask is not None:
        keep &= expert_mask[flat.clamp(0, num_experts - 1)]
    counts = torch.bincount(flat[keep], minlength=num_experts)
    padded = (counts + block_size - 1) // block_size * block_size
    total = int(num_post_padded)
    assert total == int(padded.sum())
    assert sorted_ids.numel() == expert_ids.numel() * block_size >= total
    assert torch.all(sorted_ids[total:] == P)
    real = sorted_ids[:total][sorted_ids[:total] < P].long()
    assert sorted(real.tolist()) == torch.nonzero(keep).flatten().tolist()
    for block in range(total // block_size):
        rows = sorted_ids[block * block_size : (block + 1) * block_size].long()
        rows = rows[rows < P]
        assert torch.all(flat[rows] == expert_ids[block])
        assert torch.all(rows[1:] > rows[:-1])
    assert torch.all(expert_ids[total // block_size :] == -1)


@pytest.mark.parametrize(
    ("T", "k", "E", "block_size"),
    [(1, 6, 64, 16), (7, 2, 8, 4), (40, 4, 8, 16), (33, 6, 64, 16), (150, 2, 3, 8), (5, 1, 1, 16)],
)
def test_kernel_equals_reference_and_keeps_invariants(seed, poisoned, T, k, E, block_size):
    ids, _ = random_routing(T, k, E)
    mask = torch.rand(E) < 0.5
    for expert_mask in (None, mask):
        got = sk.moe_align_block_size(ids, E, block_size, expert_mask=expert_mask)
        ref = sk.moe_align_block_size_reference(ids, E, block_size, expert_mask=expert_mask)
        for a, b in zip(got, ref, strict=True):
            assert torch.equal(a, b)
        check_invariants(ids, E, block_size, got, expert_mask)


def test_all_tokens_on_one_expert_and_out_of_range_ids(seed, poisoned):
    ids = torch.full((37, 1), 3, dtype=torch.int32)
    ids[5, 0] = 9  # outside [0, E): skipped
    ids[6, 0] = -1
    got = sk.moe_align_block_size(ids, 8, 16)
    assert torch.equal(got[2], torch.tensor([48], dtype=torch.int32))
    assert got[1][:3].tolist() == [3, 3, 3]
    check_invariants(ids, 8, 16, got)
    for a, b in zip(got, sk.moe_align_block_size_reference(ids, 8, 16), strict=True):
        assert torch.equal(a, b)


def test_sizes_are_known_from_shapes_alone():
    # the bound holds for the worst case: every pair on its own expert
    assert sk.max_aligned_blocks(6, 64, 16) == 6
    assert sk.max_aligned_blocks(192, 64, 16) == (192 + 64 * 15) // 16
    assert sk.max_aligned_blocks(0, 64, 16) == 1


def test_bad_arguments_are_refused():
    ids = torch.zeros(4, 2, dtype=torch.int64)
    with pytest.raises(ValueError, match=r"\[T, k\]"):
        sk.moe_align_block_size(ids.flatten(), 8, 16)
    with pytest.raises(TypeError, match="int32 or int64"):
        sk.moe_align_block_size(ids.float(), 8, 16)
    with pytest.raises(ValueError, match="expert_mask"):
        sk.moe_align_block_size(ids, 8, 16, expert_mask=torch.ones(7, dtype=torch.bool))
