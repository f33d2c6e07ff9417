"""PhiMoE's rotary embedding with cached frequencies: transformers' values, no per-call copy."""

from __future__ import annotations

import pytest
import torch
from transformers.models.phimoe.modeling_phimoe import PhimoeRotaryEmbedding

from specter_models import get_preset
from specter_models.loader import load_model
from specter_models.phimoe_rotary import StaticPhimoeRotaryEmbedding


def test_same_values_as_transformers_and_no_recomputation(monkeypatch):
    config = get_preset("tiny-phimoe").make_config()
    original = PhimoeRotaryEmbedding(config)
    static = StaticPhimoeRotaryEmbedding(config, "cpu")
    positions = torch.tensor([[0, 5, 17, 300], [3, 4, 5, 6]])
    x = torch.zeros(2, 4, 8, dtype=torch.float16)
    expected = original(x, positions)

    def recompute(*args, **kwargs):
        raise AssertionError("forward must not recompute the frequencies")

    monkeypatch.setattr(static, "rope_init_fn", recompute)
    got = static(x, positions)
    for a, b in zip(got, expected, strict=True):
        assert a.dtype == b.dtype
        assert torch.equal(a, b)


def test_the_engine_uses_it_and_references_do_not():
    lm = load_model("tiny-phimoe", device="cpu", dtype=torch.float32)
    assert isinstance(lm.model.model.rotary_emb, StaticPhimoeRotaryEmbedding)
    from specter_models import reference_model_from

    assert type(reference_model_from(lm).model.rotary_emb) is PhimoeRotaryEmbedding


def test_other_rope_types_are_refused():
    config = get_preset("tiny-phimoe").make_config()
    config.rope_parameters = {**config.rope_parameters, "rope_type": "longrope"}
    with pytest.raises(ValueError, match="plain RoPE"):
        StaticPhimoeRotaryEmbedding(config, "cpu")
