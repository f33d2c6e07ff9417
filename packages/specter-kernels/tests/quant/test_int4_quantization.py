"""Symmetric RTN INT4 quantization: packing, the round-trip error bound, and bad input."""

import pytest
import torch

import specter_kernels as sk
from specter_kernels.quant.int4_quantization import pack_int4, unpack_int4


def test_pack_then_unpack_is_the_identity_and_matches_the_bit_layout(seed):
    values = torch.randint(0, 16, (3, 32, 5), dtype=torch.uint8)
    words = pack_int4(values)
    assert words.dtype == torch.int32
    assert words.shape == (3, 4, 5)
    assert torch.equal(unpack_int4(words), values)
    # value j of word r sits in bits 4j..4j+3
    word = int(words[1, 2, 3]) & 0xFFFFFFFF
    assert [(word >> (4 * j)) & 0xF for j in range(8)] == values[1, 16:24, 3].tolist()


@pytest.mark.parametrize("group_size", [32, 64, 128])
def test_round_trip_error_stays_within_half_a_step(seed, group_size):
    E, N, K = 3, 24, 256
    w = torch.randn(E, N, K) * torch.rand(E, N, 1) * 3  # rows of very different scale
    w[0, 0, :group_size] = 0.0  # an all-zero group
    q = sk.quantize_int4(w, group_size)
    assert q.symmetric
    assert q.group_size == group_size
    assert q.qweight.shape == (E, K // 8, N)
    assert q.scales.shape == (E, K // group_size, N)
    back = sk.dequantize_int4(q, torch.float32)
    step = q.scales.float().repeat_interleave(group_size, dim=1).transpose(1, 2)
    # half a step, plus the fp16 rounding of the scale inside the clamp and of the product
    bound = step * (0.5 + 7.5 * 2**-11) + w.abs() * 2**-10
    assert ((back - w).abs() <= bound).all()
    assert torch.equal(back[0, 0, :group_size], torch.zeros(group_size))


def test_values_on_the_grid_survive_exactly(seed):
    scales = torch.rand(2, 8, 1) + 0.5
    grid = torch.randint(-7, 8, (2, 8, 64)).float()
    grid[..., 0] = 7.5  # pins each group's max |w| to 7.5 steps
    w = (grid * scales).half().float()
    back = sk.dequantize_int4(sk.quantize_int4(w, 64), torch.float32)
    inner = back[..., 1:]
    assert torch.allclose(inner, w[..., 1:], rtol=2e-3, atol=0)


def test_two_dimensional_input_becomes_one_expert(seed):
    w = torch.randn(16, 64)
    q = sk.quantize_int4(w, 32)
    assert q.num_experts == 1
    assert torch.equal(
        sk.dequantize_int4(q)[0], sk.dequantize_int4(sk.quantize_int4(w[None], 32))[0]
    )


@pytest.mark.parametrize(
    ("shape", "group", "error", "match"),
    [
        ((4, 100), 32, ValueError, "multiple of 8"),
        ((4, 96), 64, ValueError, "not a multiple of group_size"),
        ((4, 128), 48, ValueError, "group_size must be one of"),
        ((2, 2, 4, 64), 32, ValueError, "expects w"),
    ],
)
def test_bad_shapes_are_refused(shape, group, error, match):
    with pytest.raises(error, match=match):
        sk.quantize_int4(torch.randn(shape), group)


def test_non_float_and_non_finite_weights_are_refused():
    with pytest.raises(TypeError, match="floating-point"):
        sk.quantize_int4(torch.ones(4, 64, dtype=torch.int32), 32)
    w = torch.randn(4, 64)
    w[1, 3] = float("inf")
    with pytest.raises(ValueError, match="not finite"):
        sk.quantize_int4(w, 32)
