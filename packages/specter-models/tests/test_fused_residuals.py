"""Fused residual adds: every pre-norm decoder layer of DeepSeek-V2 and Qwen2-MoE is patched
once, and with the fused path taken its outputs keep transformers' bits (target and draft,
prefill and decode), one add_rms_norm per layer and one residual_add per shared-expert block."""

from __future__ import annotations

import pytest
import torch

import specter_models.fused_norms as fused_norms
import specter_models.fused_residuals as fused_residuals
import specter_models.shared_overlap as shared_overlap
from model_helpers import random_prompt
from specter_models import load

# Decoder layers (all pre-norm RMSNorm layers), MoE blocks with shared experts.
EXPECTED = {"tiny-deepseek-v2": (3, 2), "tiny-qwen2-moe": (2, 2), "tiny-phimoe": (0, 0)}


def _load(checkpoints, name: str, **kwargs):
    return load(checkpoints[name], device="cpu", dtype=torch.float32, **kwargs)


def _patched(lm) -> int:
    return sum(getattr(m, "_specter_fused_residuals", False) for m in lm.model.modules())


@pytest.mark.parametrize("name", list(EXPECTED))
def test_each_pre_norm_layer_is_patched_once(checkpoints, name):
    lm = _load(checkpoints, name)
    layers, _ = EXPECTED[name]
    assert _patched(lm) == layers  # PhiMoE normalises with nn.LayerNorm: none
    assert fused_residuals.install_fused_residuals(lm.model) == 0  # already installed
    assert _patched(_load(checkpoints, name, fused_residuals=False)) == 0


@pytest.fixture
def forced(monkeypatch):
    """The fused path taken on the CPU (its kernels' torch references), counting its calls."""
    calls = {"add_rms_norm": 0, "residual_add": 0}

    def counting(module, name):
        real = getattr(module, name)

        def wrapper(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)

    counting(fused_residuals, "add_rms_norm")
    counting(shared_overlap, "residual_add")
    monkeypatch.setattr(fused_residuals, "fused_applies", lambda x, weight: True)
    monkeypatch.setattr(fused_norms, "fused_applies", lambda x, weight: True)
    return calls


@pytest.mark.parametrize("name", ["tiny-deepseek-v2", "tiny-qwen2-moe"])
def test_the_fused_layers_keep_the_logits_bit_for_bit(checkpoints, name, forced):
    plain = _load(checkpoints, name, fused_residuals=False)
    fused = _load(checkpoints, name)
    prompt = random_prompt(9, plain.config.vocab_size, seed=4)
    expected = plain.target.forward(prompt, 0)
    expected_draft = plain.draft.forward(prompt[:, -1:], 9)
    assert forced == {"add_rms_norm": 0, "residual_add": 0}  # the plain model: none
    out = fused.target.forward(prompt, 0)
    layers, shared_blocks = EXPECTED[name]
    assert forced == {"add_rms_norm": layers, "residual_add": shared_blocks}
    assert torch.equal(out, expected)
    assert torch.equal(fused.draft.forward(prompt[:, -1:], 9), expected_draft)
    assert forced == {"add_rms_norm": 2 * layers, "residual_add": 2 * shared_blocks}


def test_the_switch_keeps_the_adds_apart(checkpoints, forced, monkeypatch):
    lm = _load(checkpoints, "tiny-deepseek-v2")
    prompt = random_prompt(5, lm.config.vocab_size, seed=5)
    monkeypatch.setattr(fused_residuals, "FUSED_RESIDUALS", False)
    off = lm.target.forward(prompt, 0)
    assert forced == {"add_rms_norm": 0, "residual_add": 0}
    lm.reset()
    monkeypatch.setattr(fused_residuals, "FUSED_RESIDUALS", True)
    assert torch.equal(lm.target.forward(prompt, 0), off)
    assert forced["add_rms_norm"] == 3


def test_without_specter_norms_the_layers_run_transformers_forward(checkpoints, forced):
    # fused_norms=False keeps transformers' norm arithmetic, which add_rms_norm would not give.
    lm = _load(checkpoints, "tiny-deepseek-v2", fused_norms=False)
    assert _patched(lm) == 3
    lm.target.forward(random_prompt(4, lm.config.vocab_size, seed=6), 0)
    assert forced == {"add_rms_norm": 0, "residual_add": 0}


def test_the_cpu_runs_transformers_forward(checkpoints, monkeypatch):
    calls = []
    monkeypatch.setattr(fused_residuals, "add_rms_norm", lambda *a: calls.append(a))
    lm = _load(checkpoints, "tiny-qwen2-moe")
    lm.target.forward(random_prompt(4, lm.config.vocab_size, seed=7), 0)
    assert calls == []  # CPU tensors: fused_applies is False
