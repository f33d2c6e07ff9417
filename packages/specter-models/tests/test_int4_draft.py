"""RTN INT4 draft experts: group sizes, byte counts, and per-expert quantization."""

from __future__ import annotations

import pytest
import torch

from specter_kernels import dequantize_int4, quantize_int4
from specter_models.int4_draft import Int4LayerBuilder, draft_group_size, int4_expert_bytes


@pytest.mark.parametrize(
    ("in_features", "expected"),
    [(2048, 128), (1408, 128), (6400, 128), (64, 64), (96, 32), (32, 32)],
)
def test_group_size_is_the_largest_supported_divisor(in_features, expected):
    assert draft_group_size(in_features) == expected


def test_group_size_errors():
    with pytest.raises(ValueError, match="not a multiple of any INT4 group size"):
        draft_group_size(40)
    with pytest.raises(ValueError, match="must be one of"):
        draft_group_size(128, requested=16)
    with pytest.raises(ValueError, match="divide"):
        draft_group_size(96, requested=64)


def test_builder_equals_quantizing_each_expert():
    generator = torch.Generator().manual_seed(3)
    E, H, I = 3, 128, 96
    gate_up = torch.randn(E, 2 * I, H, generator=generator)
    down = torch.randn(E, H, I, generator=generator)
    builder = Int4LayerBuilder(E, H, I, device="cpu")
    for e in reversed(range(E)):  # any order
        builder.quantize(e, gate_up[e], down[e])
    w13, w2 = builder.finish()
    assert (w13.group_size, w2.group_size) == (128, 32)
    for got, full, group in ((w13, gate_up, 128), (w2, down, 32)):
        expected = quantize_int4(full, group)
        assert torch.equal(got.qweight, expected.qweight)
        assert torch.equal(got.scales, expected.scales)
        error = (dequantize_int4(got, torch.float32) - full).abs()
        assert error.max() <= full.abs().max() / 7.5  # within a quantization step
    assert w13.nbytes + w2.nbytes == E * int4_expert_bytes(H, I)


def test_builder_refuses_wrong_shapes_and_missing_experts():
    builder = Int4LayerBuilder(2, 64, 32, device="cpu")
    with pytest.raises(ValueError, match="do not match this layer"):
        builder.quantize(0, torch.randn(64, 32), torch.randn(64, 32))
    with pytest.raises(ValueError, match="expert must be in"):
        builder.quantize(2, torch.randn(64, 64), torch.randn(64, 32))
    builder.quantize(0, torch.randn(64, 64), torch.randn(64, 32))
    with pytest.raises(RuntimeError, match=r"\[1\]"):
        builder.finish()


def test_expert_bytes_of_deepseek_v2_lite():
    # gate_up: 2048/8 * 2816 * 4 + 2048/128 * 2816 * 2; down: 1408/8 * 2048 * 4 + 11 * 2048 * 2
    assert int4_expert_bytes(2048, 1408) == 2883584 + 90112 + 1441792 + 45056
