"""The grouped FP16 expert kernel over cache slots, in waves, against its torch reference."""

import pytest
import torch

import specter_kernels as sk
from kernel_helpers import random_routing, rel_err
from specter_kernels import grouped_fp16_triton
from specter_kernels.grouped_fp16_triton import GroupedConfig

TOLERANCE = 2e-3


def problem(T, H, I, E, k, S):
    """Inputs plus slot tensors holding every expert at a random slot among S >= E."""
    x = torch.randn(T, H).half()
    ids, weights = random_routing(T, k, E)
    slot_of = torch.randperm(S)[:E].to(torch.int32)
    w13 = (torch.randn(S, 2 * I, H) * 0.05).half()
    w2 = (torch.randn(S, H, I) * 0.05).half()
    return x, ids, weights, w13, w2, slot_of


def reference_all(x, ids, weights, w13, w2, slot_of):
    E = slot_of.shape[0]
    out = torch.zeros(x.shape, dtype=torch.float32)
    everything = torch.ones(E, dtype=torch.bool)
    return sk.grouped_moe_fp16_reference(x, ids, weights, w13, w2, slot_of, everything, out)


@pytest.mark.parametrize(
    ("T", "H", "I", "E", "k", "S"),
    [(1, 64, 64, 4, 2, 6), (9, 96, 160, 8, 3, 8), (33, 128, 64, 16, 4, 20), (12, 64, 96, 8, 1, 8)],
)
def test_waves_add_up_to_the_all_at_once_result(seed, poisoned, T, H, I, E, k, S):
    x, ids, weights, w13, w2, slot_of = problem(T, H, I, E, k, S)
    resident = torch.rand(E) < 0.5
    start = torch.randn(T, H)  # the accumulator keeps what it held
    out = start.clone()
    sk.grouped_moe_fp16(x, ids, weights, w13, w2, slot_of, resident, out)
    partial = out.clone()
    sk.grouped_moe_fp16(x, ids, weights, w13, w2, slot_of, ~resident, out)
    expected = reference_all(x, ids, weights, w13, w2, slot_of)
    assert rel_err(out - start, expected) < TOLERANCE
    first_wave = sk.grouped_moe_fp16_reference(
        x, ids, weights, w13, w2, slot_of, resident, torch.zeros(T, H)
    )
    if first_wave.abs().sum() > 0:
        assert rel_err(partial - start, first_wave) < TOLERANCE


def test_only_masked_experts_read_their_slot(seed, poisoned):
    x, ids, weights, w13, w2, slot_of = problem(8, 64, 64, 8, 2, 8)
    mask = torch.zeros(8, dtype=torch.bool)
    mask[ids[0, 0]] = True
    slots = slot_of.clone()
    slots[~mask] = -1  # not resident: must never be dereferenced
    out = torch.zeros(8, 64)
    sk.grouped_moe_fp16(x, ids, weights, w13, w2, slots, mask, out)
    ref = sk.grouped_moe_fp16_reference(x, ids, weights, w13, w2, slot_of, mask, torch.zeros(8, 64))
    assert rel_err(out, ref) < TOLERANCE
    untouched = ~(ids == ids[0, 0]).any(dim=1)
    assert torch.all(out[untouched] == 0)


def test_an_empty_wave_changes_nothing(seed, poisoned):
    x, ids, weights, w13, w2, slot_of = problem(5, 64, 64, 4, 2, 4)
    out = torch.randn(5, 64)
    before = out.clone()
    sk.grouped_moe_fp16(x, ids, weights, w13, w2, slot_of, torch.zeros(4, dtype=torch.bool), out)
    assert torch.equal(out, before)


def test_larger_blocks_and_split_down(seed, poisoned):
    x, ids, weights, w13, w2, slot_of = problem(40, 64, 256, 4, 2, 4)
    out = torch.zeros(40, 64)
    config = GroupedConfig(32, 64, 64, split_k=3)
    grouped_fp16_triton.launch_grouped(
        x, ids, weights, w13, w2, slot_of, torch.ones(4, dtype=torch.bool), out, config, config
    )
    assert rel_err(out, reference_all(x, ids, weights, w13, w2, slot_of)) < TOLERANCE


def test_bad_inputs_are_refused(seed):
    x, ids, weights, w13, w2, slot_of = problem(2, 64, 64, 4, 2, 4)
    mask = torch.ones(4, dtype=torch.bool)
    out = torch.zeros(2, 64)
    with pytest.raises(TypeError, match="out must be"):
        sk.grouped_moe_fp16(x, ids, weights, w13, w2, slot_of, mask, out.half())
    with pytest.raises(TypeError, match="w13_slots"):
        sk.grouped_moe_fp16(x, ids, weights, w13.float(), w2, slot_of, mask, out)
    with pytest.raises(ValueError, match="w2_slots"):
        sk.grouped_moe_fp16(x, ids, weights, w13, w2[:, :, :32], slot_of, mask, out)
    with pytest.raises(TypeError, match="expert_mask"):
        sk.grouped_moe_fp16(x, ids, weights, w13, w2, slot_of, mask.int(), out)
    with pytest.raises(TypeError, match="expert_to_slot"):
        sk.grouped_moe_fp16(x, ids, weights, w13, w2, slot_of[:3], mask, out)
