"""Seeded random weights: per-tensor reproducibility, init rules, and the reference model."""

from __future__ import annotations

import pytest
import torch

from model_helpers import random_prompt
from specter_models import build_reference_model, reference_model_from
from specter_models.loader import load_model
from specter_models.random_weights import init_non_expert_weights, seeded_normal, tensor_seed


def test_each_tensor_has_its_own_reproducible_stream():
    a = seeded_normal("x", (4, 5), 0.5, seed=1, device="cpu", dtype=torch.float32)
    assert torch.equal(
        a, seeded_normal("x", (4, 5), 0.5, seed=1, device="cpu", dtype=torch.float32)
    )
    assert not torch.equal(
        a, seeded_normal("y", (4, 5), 0.5, seed=1, device="cpu", dtype=torch.float32)
    )
    assert not torch.equal(
        a, seeded_normal("x", (4, 5), 0.5, seed=2, device="cpu", dtype=torch.float32)
    )
    assert tensor_seed(1, "x") != tensor_seed(1, "y")
    assert 0 <= tensor_seed(3, "z") < 2**63
    big = seeded_normal("big", (200, 300), 0.02, seed=0, device="cpu", dtype=torch.float64)
    assert abs(big.std().item() - 0.02) < 0.001
    assert abs(big.mean().item()) < 0.001


def test_init_rules_follow_transformers():
    lm = load_model("tiny-phimoe", device="cpu", dtype=torch.float32, seed=5)
    model = lm.model
    assert torch.equal(model.model.norm.weight, torch.ones_like(model.model.norm.weight))
    assert torch.equal(model.model.norm.bias, torch.zeros_like(model.model.norm.bias))
    assert torch.equal(model.lm_head.bias, torch.zeros_like(model.lm_head.bias))
    q = model.model.layers[0].self_attn.q_proj.weight
    assert abs(q.std().item() - lm.config.initializer_range) < 0.02


def test_padding_row_is_zero_and_unknown_parameters_are_refused():
    embedding = torch.nn.Embedding(10, 4, padding_idx=3)
    init_non_expert_weights(embedding, seed=0, std=1.0)
    assert torch.equal(embedding.weight[3], torch.zeros(4))
    assert embedding.weight[2].abs().sum() > 0

    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.ones(3))

    with pytest.raises(ValueError, match="no rule for scale"):
        init_non_expert_weights(Odd(), seed=0, std=1.0)


@pytest.mark.parametrize("name", ["tiny-deepseek-v2", "tiny-qwen2-moe", "tiny-phimoe"])
def test_preset_engine_equals_rebuilt_transformers_model(name):
    # The seed alone reproduces the engine's weights inside transformers' own model.
    lm = load_model(name, device="cpu", dtype=torch.float64, seed=3, slots_per_layer=2)
    reference = build_reference_model(name, seed=3, device="cpu", dtype=torch.float64)
    other_seed = build_reference_model(name, seed=4, device="cpu", dtype=torch.float64)
    ids = random_prompt(8, lm.config.vocab_size, seed=0)
    with torch.no_grad():
        expected = reference(ids).logits
        assert not torch.allclose(other_seed(ids).logits, expected)
    torch.testing.assert_close(lm.target.forward(ids, 0), expected, rtol=0, atol=1e-10)
    copied = reference_model_from(lm)
    with torch.no_grad():
        torch.testing.assert_close(copied(ids).logits, expected, rtol=0, atol=0)
    assert copied.config._experts_implementation == "eager"  # float64: transformers' eager loop
