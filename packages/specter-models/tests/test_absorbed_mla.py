"""Absorbed MLA wiring: DeepSeek-V2's attention runs in the absorbed form over the
compressed cache, gives transformers' expanded attention's logits, writes the same cache
bits, and leaves other architectures alone."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import specter_models.absorbed_mla as absorbed_mla
from model_helpers import random_prompt
from specter_models.loader import load_model


def _attention(lm):
    return [m for m in lm.model.modules() if type(m).__name__.endswith("Attention")]


@pytest.mark.parametrize(
    ("name", "absorbed"),
    [("tiny-deepseek-v2", True), ("tiny-qwen2-moe", False), ("tiny-phimoe", False)],
)
def test_every_mla_module_is_replaced_once(checkpoints, name, absorbed):
    lm = load_model(checkpoints[name], device="cpu", dtype=torch.float32)
    modules = _attention(lm)
    assert modules
    assert all(getattr(m, "_specter_absorbed", False) == absorbed for m in modules)
    assert absorbed_mla.install_absorbed_mla(lm.model) == 0
    plain = load_model(checkpoints[name], device="cpu", dtype=torch.float32, absorbed_mla=False)
    assert not any(getattr(m, "_specter_absorbed", False) for m in _attention(plain))


def _prefill_then_decode(lm, prompt):
    first = lm.target.forward(prompt[:, :7], 0)
    second = lm.target.forward(prompt[:, 7:], 7)  # three rows against a cache of seven
    return first, second


def test_logits_and_cache_match_the_expanded_attention(checkpoints):
    prompt = random_prompt(10, 96, seed=5)
    path = checkpoints["tiny-deepseek-v2"]
    absorbed = load_model(path, device="cpu", dtype=torch.float64)
    expanded = load_model(path, device="cpu", dtype=torch.float64, absorbed_mla=False)
    for got, expected in zip(
        _prefill_then_decode(absorbed, prompt), _prefill_then_decode(expanded, prompt), strict=True
    ):
        torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-9)
    cached = absorbed.kv.cache.layers
    reference = expanded.kv.cache.layers
    for a, b in zip(cached, reference, strict=True):
        assert a.length == b.length == 10
        # The first layer's cache is written before any attention output: the same bits.
        torch.testing.assert_close(a.keys[:, :, :10], b.keys[:, :, :10], rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(a.values[:, :, :10], b.values[:, :, :10], rtol=1e-9, atol=1e-9)
    assert torch.equal(cached[0].keys, reference[0].keys)
    assert torch.equal(cached[0].values, reference[0].values)


def test_the_kernel_gets_the_mask_and_scale(checkpoints, monkeypatch):
    prompt = random_prompt(9, 96, seed=6)
    lm = load_model(checkpoints["tiny-deepseek-v2"], device="cpu", dtype=torch.float32)
    calls = []
    original = absorbed_mla.mla_attention

    def spy(q_lat, q_pe, c_kv, k_pe, scale, mask):
        calls.append((tuple(q_lat.shape), tuple(c_kv.shape), scale, mask))
        return original(q_lat, q_pe, c_kv, k_pe, scale, mask)

    monkeypatch.setattr(absorbed_mla, "mla_attention", spy)
    _prefill_then_decode(lm, prompt)
    layers = len(_attention(lm))
    assert len(calls) == 2 * layers
    module = _attention(lm)[0]
    heads, rank = module.num_heads, module.kv_lora_rank
    assert calls[0][:3] == ((heads, 7, rank), (7, rank), module.scaling)
    assert calls[layers][:2] == ((heads, 2, rank), (9, rank))
    for *_, mask in calls:  # causal: None (bottom-right) or a [T, L] mask hiding the future
        if mask is not None:
            assert mask.dim() == 2
            assert not bool(mask[0, -1]) or mask.shape[0] == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_value_projection_in_the_merge_gives_the_same_logits(checkpoints, monkeypatch, dtype):
    # The CPU stand-in for the CUDA path: mla_attention gets W_UV (its reference applies it)
    # and returns [T, H, v]; the logits equal the separate bmm's, prefill and decode.
    prompt = random_prompt(9, 96, seed=8)
    path = checkpoints["tiny-deepseek-v2"]
    expected = _prefill_then_decode(load_model(path, device="cpu", dtype=dtype), prompt)
    calls = []
    original = absorbed_mla.mla_attention

    def spy(*args):
        calls.append(len(args) == 7 and args[6] is not None)
        return original(*args)

    monkeypatch.setattr(absorbed_mla, "mla_attention", spy)
    monkeypatch.setattr(absorbed_mla, "fused_value_projection", lambda q_lat: True)
    got = _prefill_then_decode(load_model(path, device="cpu", dtype=dtype), prompt)
    assert calls
    assert all(calls)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5 if dtype == torch.float32 else 1e-12, atol=0)


def test_the_value_projection_applies_to_cuda_half_queries():
    def queries(dtype, cuda=True):  # a stand-in for a CUDA tensor
        return SimpleNamespace(is_cuda=cuda, dtype=dtype)

    assert absorbed_mla.fused_value_projection(queries(torch.float16))
    assert absorbed_mla.fused_value_projection(queries(torch.bfloat16))
    assert not absorbed_mla.fused_value_projection(queries(torch.float32))
    assert not absorbed_mla.fused_value_projection(queries(torch.float16, cuda=False))


def test_batches_of_several_sequences_fall_back(checkpoints):
    lm = load_model(checkpoints["tiny-deepseek-v2"], device="cpu", dtype=torch.float32)
    module = _attention(lm)[0]
    hidden = torch.randn(2, 3, lm.config.hidden_size)
    rotary = lm.model.model.rotary_emb
    freqs = rotary(hidden, torch.arange(3)[None].expand(2, 3))
    out, _ = module(hidden, attention_mask=None, position_embeddings=freqs)
    assert out.shape == (2, 3, lm.config.hidden_size)
