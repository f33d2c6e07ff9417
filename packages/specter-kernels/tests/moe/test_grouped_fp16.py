"""The grouped FP16 expert kernel over cache slots, in waves, against its torch reference."""

import pytest
import torch

import specter_kernels as sk
from kernel_helpers import random_routing, rel_err
from specter_kernels.moe import grouped_fp16_triton
from specter_kernels.moe.grouped_fp16_triton import GroupedConfig

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


@pytest.mark.parametrize("per_pair", [False, True])
def test_one_row_runs_a_block_per_pair_and_only_its_wave(seed, poisoned, per_pair):
    # T = 1 takes the unaligned launch: pair p is block p, its expert read from topk_ids.
    x, ids, weights, w13, w2, slot_of = problem(1, 64, 96, 8, 4, 8)
    ids[0, 2] = -1  # a pair routed nowhere (outside [0, E)): skipped, never dereferenced
    mask = torch.zeros(8, dtype=torch.bool)
    mask[ids[0, [0, 3]]] = True
    slots = slot_of.clone()
    slots[~mask] = -1  # not in the wave: their slots must never be read
    shape = (1, 4, 64) if per_pair else (1, 64)
    out = torch.zeros(shape)
    sk.grouped_moe_fp16(x, ids, weights, w13, w2, slots, mask, out)
    ref = sk.grouped_moe_fp16_reference(x, ids, weights, w13, w2, slot_of, mask, torch.zeros(shape))
    assert rel_err(out, ref) < TOLERANCE
    if per_pair:
        assert torch.all(out[0, [1, 2]] == 0)  # pairs outside the wave keep their zeros
        assert torch.all(out[0, [0, 3]] != 0)


@pytest.mark.parametrize("per_pair", [False, True])
def test_pair_blocks_on_many_rows_match_the_aligned_launch(seed, poisoned, per_pair):
    x, ids, weights, w13, w2, slot_of = problem(9, 64, 96, 8, 3, 8)
    resident = torch.rand(8) < 0.5
    shape = (9, 3, 64) if per_pair else (9, 64)
    got = {}
    for pair_blocks in (False, True):
        out = torch.zeros(shape)
        for mask in (resident, ~resident):
            sk.grouped_moe_fp16(x, ids, weights, w13, w2, slot_of, mask, out, pair_blocks)
        got[pair_blocks] = out
    # Per pair the GPU gives the same bits either way (test_gpu.py's
    # test_grouped_fp16_waves_on_the_gpu asserts it). The interpreter cannot: its tl.dot is
    # numpy's matmul, whose BLAS rounds a row differently by its position in the block, and
    # the two launches place a pair at different rows (1e-9 apart on about a third of seeds).
    # Accumulating outputs differ anyway: their atomics add in any order.
    assert rel_err(got[True], got[False]) < TOLERANCE
    if per_pair:
        assert torch.allclose(got[True], got[False], rtol=0, atol=1e-7)


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


def _per_pair_waves(x, ids, weights, w13, w2, slot_of, resident):
    out = torch.zeros(x.shape[0], ids.shape[1], x.shape[1])
    sk.grouped_moe_fp16(x, ids, weights, w13, w2, slot_of, resident, out)
    sk.grouped_moe_fp16(x, ids, weights, w13, w2, slot_of, ~resident, out)
    return out


@pytest.mark.parametrize(
    ("T", "H", "I", "E", "k", "S"), [(1, 64, 64, 4, 2, 6), (9, 96, 80, 8, 3, 8)]
)
def test_per_pair_waves_match_the_reference(seed, poisoned, T, H, I, E, k, S):
    x, ids, weights, w13, w2, slot_of = problem(T, H, I, E, k, S)
    resident = torch.rand(E) < 0.5
    first = torch.zeros(T, k, H)
    sk.grouped_moe_fp16(x, ids, weights, w13, w2, slot_of, resident, first)
    in_first = resident[ids]  # [T, k]: the pairs this wave owns
    assert torch.all(first[~in_first] == 0)  # disjoint masks fill disjoint pairs
    out = _per_pair_waves(x, ids, weights, w13, w2, slot_of, resident)
    assert torch.equal(out[in_first], first[in_first])
    ref = sk.grouped_moe_fp16_reference(
        x, ids, weights, w13, w2, slot_of, torch.ones(E, dtype=torch.bool), torch.zeros(T, k, H)
    )
    assert rel_err(out, ref) < TOLERANCE
    assert rel_err(sk.sum_routed_pairs(out), reference_all(x, ids, weights, w13, w2, slot_of)) < (
        TOLERANCE
    )


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_per_pair_mode_is_bitwise_batch_invariant(seed, monkeypatch, backend):
    if backend == "triton":
        pytest.importorskip("triton")
    monkeypatch.setenv("SPECTER_KERNELS_BACKEND", backend)
    T, H, I, E, k = 20, 64, 64, 4, 2
    x, ids, weights, w13, w2, slot_of = problem(T, H, I, E, k, E)
    resident = torch.rand(E) < 0.5
    full = sk.sum_routed_pairs(_per_pair_waves(x, ids, weights, w13, w2, slot_of, resident))
    for m in (1, 3, T):
        part = _per_pair_waves(x[:m], ids[:m], weights[:m], w13, w2, slot_of, resident)
        assert torch.equal(full[:m], sk.sum_routed_pairs(part))
    changed = x.clone()
    changed[1:] = torch.randn(T - 1, H).half()
    again = sk.sum_routed_pairs(_per_pair_waves(changed, ids, weights, w13, w2, slot_of, resident))
    assert torch.equal(again[0], full[0])


@pytest.mark.parametrize("dtype", [None, torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("T", "k", "H"), [(1, 6, 64), (5, 2, 100), (3, 1, 1100)])
def test_sum_routed_pairs_kernel_has_the_references_bits(
    seed, poisoned, exact_bf16, dtype, T, k, H
):
    # Magnitudes far apart, so a different add order or a second rounding changes bits.
    out = torch.randn(T, k, H) * torch.logspace(-3, 3, k)[None, :, None]
    got = sk.sum_routed_pairs(out, dtype)
    want = sk.sum_routed_pairs_reference(out, dtype)
    assert got.dtype == (dtype or torch.float32)
    assert got.shape == (T, H)
    assert torch.equal(got, want)
    sequential = out[:, 0].clone()
    for j in range(1, k):
        sequential = sequential + out[:, j]
    assert torch.equal(want, sequential.to(dtype or torch.float32))


def test_sum_routed_pairs_kernel_takes_strided_pairs(seed, poisoned):
    wide = torch.randn(4, 3, 2, 48)
    out = wide[:, :, 1]  # [4, 3, 48], strides (288, 96, 1)
    assert torch.equal(
        sk.sum_routed_pairs(out, torch.float16), ((out[:, 0] + out[:, 1]) + out[:, 2]).half()
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(("T", "k", "H"), [(1, 6, 64), (5, 2, 100), (3, 1, 1100)])
def test_residual_add_routed_pairs_kernel_has_the_two_launch_bits(
    seed, poisoned, exact_bf16, dtype, T, k, H
):
    # Magnitudes far apart, so another add order or a missed rounding changes bits.
    pairs = torch.randn(T, k, H) * torch.logspace(-3, 3, k)[None, :, None]
    residual = (torch.randn(T, H) * 30).to(dtype)
    shared = (torch.randn(T, H) * 0.01).to(dtype)
    got = sk.residual_add_routed_pairs(residual, pairs, shared)
    two_launches = sk.residual_add(residual, sk.sum_routed_pairs(pairs, dtype), shared)
    assert got.dtype == dtype
    assert got.shape == (T, H)
    assert torch.equal(got, two_launches)
    assert torch.equal(got, sk.residual_add_routed_pairs_reference(residual, pairs, shared))
    # Each row alone: the same bits (one program per row and column block).
    alone = sk.residual_add_routed_pairs(residual[-1:], pairs[-1:], shared[-1:])
    assert torch.equal(got[-1:], alone)


def test_residual_add_routed_pairs_takes_strided_pairs_and_refuses_mismatches(seed, poisoned):
    wide = torch.randn(4, 3, 2, 48)
    pairs = wide[:, :, 1]  # [4, 3, 48], strides (288, 96, 1)
    residual, shared = torch.randn(4, 48).half(), torch.randn(4, 48).half()
    routed = ((pairs[:, 0] + pairs[:, 1]) + pairs[:, 2]).half()
    assert torch.equal(
        sk.residual_add_routed_pairs(residual, pairs, shared), residual + (routed + shared)
    )
    with pytest.raises(ValueError, match=r"shared is \(4, 40\).*\[T, H\] = \[4, 48\]"):
        sk.residual_add_routed_pairs(residual, pairs, shared[:, :40])
    with pytest.raises(TypeError, match=r"shared is torch\.float32 but residual is torch\.float16"):
        sk.residual_add_routed_pairs(residual, pairs, shared.float())
    with pytest.raises(TypeError, match=r"float32 \[T, k, H\]"):
        sk.residual_add_routed_pairs(residual, pairs.half(), shared)


def test_sum_routed_pairs_refuses_a_non_float_dtype():
    with pytest.raises(TypeError, match="dtype must be"):
        sk.sum_routed_pairs(torch.zeros(2, 2, 4), torch.int32)


def test_sum_routed_pairs_adds_in_pair_order_and_refuses_2d(seed):
    out = torch.randn(5, 3, 8)
    assert torch.equal(sk.sum_routed_pairs(out), (out[:, 0] + out[:, 1]) + out[:, 2])
    with pytest.raises(TypeError, match=r"\[T, k, H\]"):
        sk.sum_routed_pairs(torch.zeros(5, 8))
    x, ids, weights, w13, w2, slot_of = problem(2, 64, 64, 4, 2, 4)
    mask = torch.ones(4, dtype=torch.bool)
    with pytest.raises(TypeError, match="per-pair"):
        sk.grouped_moe_fp16(x, ids, weights, w13, w2, slot_of, mask, torch.zeros(2, 3, 64))


def test_per_pair_tile_parses_and_refuses_bad_values():
    tile = grouped_fp16_triton.parse_per_pair_tile("16/4/4/256")
    assert tile == GroupedConfig(16, 16, 256, num_warps=4, num_stages=4)
    for bad, says in (
        ("16/4/4", "four integers"),
        ("a/4/4/128", "four integers"),
        ("24/4/4/128", "block_n 24"),
        ("32/4/4/8", "block_k 8"),
        ("32/0/4/128", "stages 0"),
        ("32/4/3/128", "warps 3"),
    ):
        with pytest.raises(ValueError, match=says) as info:
            grouped_fp16_triton.parse_per_pair_tile(bad)
        assert bad in str(info.value)


def test_per_pair_tiles_are_fixed_per_device_type():
    tile = GroupedConfig(16, 32, 128, num_warps=4, num_stages=4)
    assert grouped_fp16_triton.per_pair_configs(torch.device("cuda")) == (tile, tile)
    cpu = grouped_fp16_triton.per_pair_configs(torch.device("cpu"))
    assert cpu[0] != tile
    assert cpu[0].block_k == 64
