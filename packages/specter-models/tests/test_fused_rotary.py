"""Fused rotary wiring: DeepSeek-V2 attention modules use specter-kernels' rotary_complex
during their own forward on CUDA, transformers' function elsewhere and for everyone else."""

from __future__ import annotations

import pytest
import torch
from transformers.models.deepseek_v2 import modeling_deepseek_v2

import specter_models.fused_rotary as fused_rotary
from model_helpers import random_prompt
from specter_models import load


def _attention(lm):
    return [m for m in lm.model.modules() if type(m).__name__ == "DeepseekV2Attention"]


@pytest.mark.parametrize(
    ("name", "wrapped"),
    [("tiny-deepseek-v2", True), ("tiny-qwen2-moe", False), ("tiny-phimoe", False)],
)
def test_deepseek_attention_modules_are_wrapped_once(checkpoints, name, wrapped):
    lm = load(checkpoints[name], device="cpu", dtype=torch.float32)
    modules = _attention(lm)
    assert bool(modules) == wrapped
    assert all(getattr(m, "_specter_fused_rotary", False) for m in modules)
    assert fused_rotary.install_fused_rotary(lm.model) == 0  # already installed
    plain = load(checkpoints[name], device="cpu", dtype=torch.float32, fused_rotary=False)
    assert not any(getattr(m, "_specter_fused_rotary", False) for m in _attention(plain))


def test_the_fused_call_computes_transformers_rotary_and_is_scoped(checkpoints, monkeypatch):
    original = modeling_deepseek_v2.apply_rotary_emb
    prompt = random_prompt(6, 96, seed=3)
    plain = load(checkpoints["tiny-deepseek-v2"], device="cpu", dtype=torch.float32,
                 fused_rotary=False)  # fmt: skip
    expected = plain.target.forward(prompt, 0)
    lm = load(checkpoints["tiny-deepseek-v2"], device="cpu", dtype=torch.float32)
    calls = []

    def applies(xq, xk, freqs_cis):
        calls.append((tuple(xq.shape), tuple(xk.shape)))
        # Inside an attention forward the module attribute is the fused function.
        assert modeling_deepseek_v2.apply_rotary_emb is not original
        return True  # the fused entry point on the CPU: its torch reference

    monkeypatch.setattr(fused_rotary, "rotary_applies", applies)
    assert torch.equal(lm.target.forward(prompt, 0), expected)
    assert len(calls) == len(_attention(lm))
    assert modeling_deepseek_v2.apply_rotary_emb is original  # restored after each call


def test_the_module_attribute_is_restored_when_a_forward_fails(checkpoints, monkeypatch):
    original = modeling_deepseek_v2.apply_rotary_emb
    lm = load(checkpoints["tiny-deepseek-v2"], device="cpu", dtype=torch.float32)

    def boom(*_args):
        raise RuntimeError("boom")

    monkeypatch.setattr(fused_rotary, "rotary_applies", boom)
    with pytest.raises(RuntimeError, match="boom"):
        lm.target.forward(random_prompt(4, 96, seed=1), 0)
    assert modeling_deepseek_v2.apply_rotary_emb is original


def test_only_matching_cuda_calls_are_taken():
    q, k = torch.randn(1, 2, 3, 8), torch.randn(1, 1, 3, 8)
    freqs = torch.polar(torch.ones(1, 3, 4), torch.rand(1, 3, 4))
    assert not fused_rotary.rotary_applies(q, k, freqs)  # CPU tensors
