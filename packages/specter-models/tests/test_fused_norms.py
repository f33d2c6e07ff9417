"""Fused RMSNorm wiring: every RMSNorm module routed through specter-kernels' rms_norm with
its own weight and epsilon on CUDA, transformers' forward elsewhere."""

from __future__ import annotations

import pytest
import torch

import specter_models.fused_norms as fused_norms
from model_helpers import random_prompt
from specter_models.loader import load_model


def _norms(lm):
    return [m for m in lm.model.modules() if fused_norms.is_rms_norm(m)]


@pytest.mark.parametrize(
    ("name", "has_rms_norms"),
    [("tiny-deepseek-v2", True), ("tiny-qwen2-moe", True), ("tiny-phimoe", False)],
)
def test_every_rms_norm_is_wrapped_once(checkpoints, name, has_rms_norms):
    lm = load_model(checkpoints[name], device="cpu", dtype=torch.float32)
    norms = _norms(lm)
    assert bool(norms) == has_rms_norms  # PhiMoE normalises with nn.LayerNorm
    assert all(getattr(m, "_specter_fused", False) for m in norms)
    assert fused_norms.install_fused_rms_norm(lm.model) == 0  # already installed
    plain = load_model(checkpoints[name], device="cpu", dtype=torch.float32, fused_norms=False)
    assert not any(getattr(m, "_specter_fused", False) for m in _norms(plain))


@pytest.mark.parametrize("name", ["tiny-deepseek-v2", "tiny-qwen2-moe"])
def test_the_fused_call_gets_the_module_weight_and_epsilon(checkpoints, name, monkeypatch):
    prompt = random_prompt(6, 96, seed=2)
    lm = load_model(checkpoints[name], device="cpu", dtype=torch.float32)
    for module in _norms(lm):  # distinct epsilons: a swapped or default one would show
        module.variance_epsilon = 0.5 + torch.rand(()).item()
    expected = lm.target.forward(prompt, 0)
    lm.reset()
    calls = []

    def applies(x, weight):
        calls.append(x.shape)
        return True  # the fused entry point on the CPU: its torch reference

    monkeypatch.setattr(fused_norms, "fused_applies", applies)
    assert torch.equal(lm.target.forward(prompt, 0), expected)
    assert len(calls) == len(_norms(lm))
