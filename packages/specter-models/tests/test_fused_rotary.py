"""Fused rotary wiring: attention modules use specter-kernels' rotary kernels during their
own forward on CUDA, transformers' function elsewhere and for every other model."""

from __future__ import annotations

import sys

import pytest
import torch

import specter_models.fused_rotary as fused_rotary
from model_helpers import random_prompt
from specter_models.loader import load_model

# preset -> (attention class, the module-level function it calls, the applies() check)
CASES = {
    "tiny-deepseek-v2": ("DeepseekV2Attention", "apply_rotary_emb", "rotary_applies"),
    "tiny-qwen2-moe": ("Qwen2MoeAttention", "apply_rotary_pos_emb", "rotary_half_applies"),
    "tiny-phimoe": ("PhimoeAttention", "apply_rotary_pos_emb", "rotary_half_applies"),
}


def _attention(lm, cls):
    return [m for m in lm.model.modules() if type(m).__name__ == cls]


def test_every_attention_module_is_wrapped_once(checkpoints, arch_name):
    cls, _, _ = CASES[arch_name]
    lm = load_model(checkpoints[arch_name], device="cpu", dtype=torch.float32)
    modules = _attention(lm, cls)
    assert modules
    assert all(getattr(m, "_specter_fused_rotary", False) for m in modules)
    assert fused_rotary.install_fused_rotary(lm.model) == 0  # already installed
    plain = load_model(
        checkpoints[arch_name], device="cpu", dtype=torch.float32, fused_rotary=False
    )
    assert not any(getattr(m, "_specter_fused_rotary", False) for m in _attention(plain, cls))


def test_the_fused_call_computes_transformers_rotary_and_is_scoped(
    checkpoints, arch_name, monkeypatch
):
    cls, function, check = CASES[arch_name]
    lm = load_model(checkpoints[arch_name], device="cpu", dtype=torch.float32)
    namespace = sys.modules[type(_attention(lm, cls)[0]).__module__]
    original = getattr(namespace, function)
    prompt = random_prompt(6, 96, seed=3)
    plain = load_model(
        checkpoints[arch_name], device="cpu", dtype=torch.float32, fused_rotary=False
    )
    expected = plain.target.forward(prompt, 0)
    calls = []

    def applies(*args):
        calls.append(args[0].shape)
        # Inside an attention forward the module attribute is the fused function.
        assert getattr(namespace, function) is not original
        return True  # the fused entry point on the CPU: its torch reference

    monkeypatch.setattr(fused_rotary, check, applies)
    assert torch.equal(lm.target.forward(prompt, 0), expected)
    assert len(calls) == len(_attention(lm, cls))
    assert getattr(namespace, function) is original  # restored after each call


def test_the_module_attribute_is_restored_when_a_forward_fails(checkpoints, monkeypatch):
    lm = load_model(checkpoints["tiny-qwen2-moe"], device="cpu", dtype=torch.float32)
    namespace = sys.modules[type(_attention(lm, "Qwen2MoeAttention")[0]).__module__]
    original = namespace.apply_rotary_pos_emb

    def boom(*_args):
        raise RuntimeError("boom")

    monkeypatch.setattr(fused_rotary, "rotary_half_applies", boom)
    with pytest.raises(RuntimeError, match="boom"):
        lm.target.forward(random_prompt(4, 96, seed=1), 0)
    assert namespace.apply_rotary_pos_emb is original


def test_only_matching_cuda_calls_are_taken():
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 1, 3, 8)
    freqs = torch.polar(torch.ones(1, 3, 4), torch.rand(1, 3, 4))
    assert not fused_rotary.rotary_applies(q, k, freqs)  # CPU tensors
    cos, sin = torch.randn(1, 3, 8), torch.randn(1, 3, 8)
    assert not fused_rotary.rotary_half_applies(q, k, cos, sin, 1)  # CPU tensors
