"""The Int4Weight container: validation, sizes, slicing, stacking and gate/up concatenation."""

import pytest
import torch

import specter_kernels as sk
from kernel_helpers import random_int4


def test_properties_describe_the_gptq_layout(seed):
    w = random_int4(3, 40, 64, 32, asymmetric=True)
    assert (w.num_experts, w.out_features, w.in_features, w.group_size) == (3, 40, 64, 32)
    assert not w.symmetric
    per_expert = 64 // 8 * 40 * 4 + 64 // 32 * 40 * 2 + 64 // 32 * 40  # words, scales, zeros
    assert w.nbytes == 3 * per_expert
    assert w.nbytes_per_expert == per_expert


@pytest.mark.parametrize(
    ("qweight", "scales", "zeros", "group", "error"),
    [
        (
            torch.zeros(1, 8, 16, dtype=torch.int64),
            torch.ones(1, 2, 16).half(),
            None,
            32,
            TypeError,
        ),
        (torch.zeros(1, 8, 16, dtype=torch.int32), torch.ones(1, 2, 16), None, 32, TypeError),
        (torch.zeros(8, 16, dtype=torch.int32), torch.ones(2, 16).half(), None, 32, ValueError),
        (
            torch.zeros(1, 8, 16, dtype=torch.int32),
            torch.ones(1, 3, 16).half(),
            None,
            32,
            ValueError,
        ),
        (
            torch.zeros(1, 8, 16, dtype=torch.int32),
            torch.ones(1, 2, 16).half(),
            None,
            12,
            ValueError,
        ),
        (
            torch.zeros(1, 8, 16, dtype=torch.int32),
            torch.ones(1, 1, 16).half(),
            None,
            48,
            ValueError,
        ),
        (
            torch.zeros(1, 8, 16, dtype=torch.int32),
            torch.ones(1, 2, 16).half(),
            torch.zeros(1, 2, 16, dtype=torch.int32),
            32,
            TypeError,
        ),
        (
            torch.zeros(1, 16, 8, dtype=torch.int32).transpose(1, 2),
            torch.ones(1, 4, 16).half(),
            None,
            32,
            ValueError,
        ),
    ],
)
def test_bad_tensors_are_refused(qweight, scales, zeros, group, error):
    with pytest.raises(error):
        sk.Int4Weight(qweight, scales, zeros, group)


def test_expert_selection_keeps_the_chosen_experts(seed):
    w = random_int4(5, 16, 64, 32, asymmetric=True)
    full = sk.dequantize_int4(w)
    picked = w.experts(torch.tensor([4, 1]))
    assert torch.equal(sk.dequantize_int4(picked), full[[4, 1]])
    assert torch.equal(sk.dequantize_int4(w.experts(2)), full[2:3])


def test_stacking_matches_the_per_expert_dequantization(seed):
    parts = [random_int4(1, 24, 64, 32), random_int4(2, 24, 64, 32, asymmetric=True)]
    stacked = sk.stack_int4_experts(parts)
    assert stacked.num_experts == 3
    assert not stacked.symmetric
    expected = torch.cat([sk.dequantize_int4(p) for p in parts])
    assert torch.equal(sk.dequantize_int4(stacked), expected)
    with pytest.raises(ValueError, match="expected"):
        sk.stack_int4_experts([parts[0], random_int4(1, 24, 64, 64)])
    with pytest.raises(ValueError, match="at least one"):
        sk.stack_int4_experts([])


def test_concat_gate_up_puts_gate_rows_first(seed):
    gate, up = random_int4(2, 16, 64, 32), random_int4(2, 16, 64, 32, asymmetric=True)
    fused = sk.concat_gate_up(gate, up)
    assert (fused.out_features, fused.in_features) == (32, 64)
    dense = sk.dequantize_int4(fused)
    assert torch.equal(dense[:, :16], sk.dequantize_int4(gate))
    assert torch.equal(dense[:, 16:], sk.dequantize_int4(up))
    with pytest.raises(ValueError, match="share"):
        sk.concat_gate_up(gate, random_int4(2, 16, 128, 32))
