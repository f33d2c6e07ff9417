"""The fused W4A16 kernel under the Triton interpreter against its torch reference.

Buffers are poisoned (NaN) beforehand, so an element no program writes fails the
comparison. The kernels' fp16 dequantization matches the reference bit for bit;
what remains is fp32 summation order and the fp16 rounding of the intermediate
(plus, for math=1, the reference's fp16 rounding of each weight).
"""

import pytest
import torch

import specter_kernels as sk
from kernel_helpers import random_int4, random_routing, rel_err
from specter_kernels.moe import w4a16_triton
from specter_kernels.moe.fused_w4a16 import choose_path
from specter_kernels.moe.w4a16_triton import GemvConfig, TileConfig

TOLERANCE = 2e-3


def problem(T, H, I, E, k, group, *, asymmetric=False, ids_dtype=torch.int64):
    x = torch.randn(T, H).half()
    ids, weights = random_routing(T, k, E, dtype=ids_dtype)
    w13 = random_int4(E, 2 * I, H, group, asymmetric=asymmetric)
    w2 = random_int4(E, H, I, group, asymmetric=asymmetric)
    return x, ids, weights, w13, w2


@pytest.mark.parametrize(
    ("T", "H", "I", "E", "k", "group", "asymmetric"),
    [
        (1, 64, 64, 4, 2, 32, False),  # T = 1
        (3, 96, 160, 8, 3, 32, True),  # shapes not multiples of the blocks, asym zeros
        (2, 256, 128, 8, 1, 128, False),  # k = 1, whole-tile groups
        (5, 128, 64, 6, 2, 64, True),
    ],
)
def test_gemv_path_equals_reference(seed, poisoned, T, H, I, E, k, group, asymmetric):
    x, ids, weights, w13, w2 = problem(T, H, I, E, k, group, asymmetric=asymmetric)
    out = sk.fused_moe_w4a16(x, ids, weights, w13, w2, path="gemv")
    ref = sk.fused_moe_w4a16_reference(x, ids, weights, w13, w2)
    assert out.dtype == torch.float16
    assert out.shape == (T, H)
    assert rel_err(out, ref) < TOLERANCE


@pytest.mark.parametrize(
    ("T", "H", "I", "E", "k", "group", "asymmetric"),
    [
        (40, 96, 160, 8, 2, 32, True),  # many tokens per expert, partial blocks
        (9, 128, 64, 16, 4, 64, False),  # some experts get no token
        (1, 256, 128, 8, 1, 128, False),
    ],
)
def test_tile_path_equals_reference(seed, poisoned, T, H, I, E, k, group, asymmetric):
    x, ids, weights, w13, w2 = problem(T, H, I, E, k, group, asymmetric=asymmetric)
    out = sk.fused_moe_w4a16(x, ids, weights, w13, w2, path="tile")
    assert rel_err(out, sk.fused_moe_w4a16_reference(x, ids, weights, w13, w2)) < TOLERANCE


@pytest.mark.parametrize("path", ["gemv", "tile"])
def test_all_tokens_on_one_expert(seed, poisoned, path):
    x, _, _, w13, w2 = problem(19, 64, 64, 4, 1, 32)
    ids = torch.full((19, 1), 2, dtype=torch.int32)
    weights = torch.rand(19, 1).half()
    out = sk.fused_moe_w4a16(x, ids, weights, w13, w2, path=path)
    assert rel_err(out, sk.fused_moe_w4a16_reference(x, ids, weights, w13, w2)) < TOLERANCE


@pytest.mark.parametrize("math", [0, 1, 2, 3])
@pytest.mark.parametrize("split", [1, 3])
def test_every_gemv_variant_and_split(seed, poisoned, math, split):
    # K = 256 and 384 with block_k 128: three splits, the last one partial or empty
    x, ids, weights, w13, w2 = problem(3, 256, 384, 8, 2, 32, asymmetric=math in (1, 3))
    gate_up, down = GemvConfig(64, 128, split, math=math), GemvConfig(128, 128, split, math=math)
    out = w4a16_triton.launch_gemv(x, ids, weights, w13, w2, gate_up, down)
    assert rel_err(out, sk.fused_moe_w4a16_reference(x, ids, weights, w13, w2)) < TOLERANCE


@pytest.mark.parametrize("split", [1, 2])
def test_tile_splits(seed, poisoned, split):
    x, ids, weights, w13, w2 = problem(6, 256, 256, 4, 2, 64)
    config = TileConfig(16, 64, 128, split)
    out = w4a16_triton.launch_tile(x, ids, weights, w13, w2, config, config)
    assert rel_err(out, sk.fused_moe_w4a16_reference(x, ids, weights, w13, w2)) < TOLERANCE


def _skip_some_pairs(ids: torch.Tensor) -> torch.Tensor:
    """A copy of ``ids`` with about half of the pairs marked skipped (-1), and every pair of
    token 0 skipped (a token with nothing to add must still get its row: zeros)."""
    skipped = ids.clone()
    skipped[torch.rand(ids.shape) < 0.5] = -1
    skipped[0] = -1
    return skipped


@pytest.mark.parametrize(
    ("path", "T", "E", "k", "split"),
    [("gemv", 1, 8, 3, 1), ("gemv", 3, 8, 2, 3), ("tile", 9, 4, 2, 1), ("tile", 20, 8, 2, 2)],
)
def test_skipped_pairs_add_nothing(seed, poisoned, path, T, E, k, split):
    # The same problem with the skipped pairs' weights zeroed instead, through the reference
    # on their real experts: what the kernel must give when those pairs are left out.
    x, ids, weights, w13, w2 = problem(T, 256, 128, E, k, 64)
    skipped = _skip_some_pairs(ids)
    if path == "gemv":
        out = w4a16_triton.launch_gemv(
            x, skipped, weights, w13, w2, GemvConfig(64, 128, split), GemvConfig(128, 128, split)
        )
    else:
        config = TileConfig(16, 64, 128, split)
        out = w4a16_triton.launch_tile(x, skipped, weights, w13, w2, config, config)
    kept = sk.fused_moe_w4a16_reference(x, ids, weights * (skipped >= 0), w13, w2)
    assert rel_err(out, kept) < TOLERANCE
    assert torch.equal(out[0], torch.zeros_like(out[0]))  # every pair of token 0 skipped
    assert rel_err(out, sk.fused_moe_w4a16_reference(x, skipped, weights, w13, w2)) < TOLERANCE


def test_reference_skips_pairs_too(seed):
    x, ids, weights, w13, w2 = problem(4, 64, 64, 4, 2, 32)
    skipped = _skip_some_pairs(ids)
    out = sk.fused_moe_w4a16_reference(x, skipped, weights, w13, w2)
    kept = sk.fused_moe_w4a16_reference(x, ids, weights * (skipped >= 0), w13, w2)
    assert rel_err(out, kept) < TOLERANCE  # CPU matmuls of other row counts: not bit-equal
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    none = sk.fused_moe_w4a16_reference(x, torch.full_like(ids, -1), weights, w13, w2)
    assert torch.equal(none, torch.zeros_like(none))


def test_torch_backend_is_the_reference(seed, monkeypatch):
    monkeypatch.setenv("SPECTER_KERNELS_BACKEND", "torch")
    x, ids, weights, w13, w2 = problem(4, 64, 64, 4, 2, 32)
    out = sk.fused_moe_w4a16(x, ids, weights, w13, w2)
    assert torch.equal(out, sk.fused_moe_w4a16_reference(x, ids, weights, w13, w2))


def test_no_tokens_gives_an_empty_output():
    x, ids, weights, w13, w2 = problem(0, 64, 64, 4, 2, 32)
    assert sk.fused_moe_w4a16(x, ids, weights, w13, w2).shape == (0, 64)


def test_path_choice_follows_expert_sharing():
    assert choose_path(1, 6, 64) == "gemv"
    assert choose_path(4, 6, 64) == "gemv"  # 24 pairs on about 21 experts
    assert choose_path(32, 6, 64) == "tile"  # 192 pairs on about 62 experts
    assert choose_path(8, 2, 16) == "tile"


def test_tensor_core_shapes_below_sixteen_are_refused(seed):
    x, ids, weights, w13, w2 = problem(2, 256, 128, 4, 2, 32)
    with pytest.raises(ValueError, match="block_k >= 128"):
        w4a16_triton.launch_tile(
            x, ids, weights, w13, w2, TileConfig(16, 64, 64), TileConfig(16, 64, 64)
        )
    with pytest.raises(ValueError, match="math=2"):
        w4a16_triton.launch_gemv(
            x, ids, weights, w13, w2, GemvConfig(64, 64, math=2), GemvConfig(64, 64)
        )
    with pytest.raises(ValueError, match="block_m"):
        w4a16_triton.launch_tile(
            x, ids, weights, w13, w2, TileConfig(16, 64, 128), TileConfig(32, 64, 128)
        )


def test_bad_inputs_are_refused(seed):
    x, ids, weights, w13, w2 = problem(2, 64, 64, 4, 2, 32)
    with pytest.raises(TypeError, match="float16"):
        sk.fused_moe_w4a16(x.bfloat16(), ids, weights, w13, w2)
    with pytest.raises(ValueError, match="topk_ids"):
        sk.fused_moe_w4a16(x, ids[:1], weights, w13, w2)
    with pytest.raises(ValueError, match="topk_weights"):
        sk.fused_moe_w4a16(x, ids, weights[:, :1], w13, w2)
    with pytest.raises(ValueError, match="w13"):
        sk.fused_moe_w4a16(x, ids, weights, random_int4(4, 128, 128, 32), w2)
    with pytest.raises(ValueError, match="w2 must be"):
        sk.fused_moe_w4a16(x, ids, weights, w13, w13)
    with pytest.raises(TypeError, match="Int4Weight"):
        sk.fused_moe_w4a16(x, ids, weights, w13, sk.dequantize_int4(w2))
    with pytest.raises(ValueError, match="path"):
        sk.fused_moe_w4a16(x, ids, weights, w13, w2, path="marlin")
