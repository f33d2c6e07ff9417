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
from specter_models.loader import load_model

# Decoder layers (all pre-norm RMSNorm layers), MoE blocks with shared experts.
EXPECTED = {"tiny-deepseek-v2": (3, 2), "tiny-qwen2-moe": (2, 2), "tiny-phimoe": (0, 0)}


def _load(checkpoints, name: str, **kwargs):
    return load_model(checkpoints[name], device="cpu", dtype=torch.float32, **kwargs)


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
    calls = {"add_rms_norm": 0, "residual_add": 0, "residual_add_rms_norm": 0, "rms_norm": 0}

    def counting(module, name):
        real = getattr(module, name)

        def wrapper(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)

    counting(fused_residuals, "add_rms_norm")
    counting(shared_overlap, "residual_add")
    counting(shared_overlap, "residual_add_rms_norm")
    counting(fused_norms, "rms_norm")
    monkeypatch.setattr(fused_residuals, "fused_applies", lambda x, weight: True)
    monkeypatch.setattr(fused_norms, "fused_applies", lambda x, weight: True)
    return calls


def _adds(calls):
    return {k: v for k, v in calls.items() if k != "rms_norm"}


@pytest.mark.parametrize("name", ["tiny-deepseek-v2", "tiny-qwen2-moe"])
def test_the_fused_layers_keep_the_logits_bit_for_bit(checkpoints, name, forced):
    # Each shared-expert block's join also normalises its output for the next norm (the
    # next layer's input norm, the last layer's: the final norm), which then launches
    # nothing: the same logits, one rms_norm fewer per such block.
    plain = _load(checkpoints, name, fused_residuals=False)
    fused = _load(checkpoints, name)
    prompt = random_prompt(9, plain.config.vocab_size, seed=4)
    expected = plain.target.forward(prompt, 0)
    expected_draft = plain.draft.forward(prompt[:, -1:], 9)
    norms = forced["rms_norm"]
    assert _adds(forced) == dict.fromkeys(_adds(forced), 0)  # the plain model: none
    out = fused.target.forward(prompt, 0)
    layers, shared_blocks = EXPECTED[name]
    want = {"add_rms_norm": layers, "residual_add": 0, "residual_add_rms_norm": shared_blocks}
    assert _adds(forced) == want
    # The plain target and draft launched ``norms``, half each; the fused target's
    # post-attention norms run in add_rms_norm and a norm after each block comes from its join.
    assert forced["rms_norm"] - norms == norms // 2 - layers - shared_blocks
    assert torch.equal(out, expected)
    assert torch.equal(fused.draft.forward(prompt[:, -1:], 9), expected_draft)
    assert _adds(forced) == {k: 2 * v for k, v in want.items()}


def test_a_handed_norm_is_taken_only_for_its_own_input(checkpoints, forced):
    # The handed result belongs to one tensor object: a norm called on anything else
    # normalises that, and the hand-over is gone after one call.
    lm = _load(checkpoints, "tiny-qwen2-moe")
    norm = lm.model.model.norm
    x = torch.randn(1, 3, lm.config.hidden_size)
    fused_norms.hand_normed(norm, x, torch.zeros_like(x))
    other = x.clone()
    assert torch.equal(norm(other), fused_norms.rms_norm(other, norm.weight, norm.variance_epsilon))
    assert not torch.equal(norm(x), torch.zeros_like(x))  # taken away by the call before
    fused_norms.hand_normed(norm, x, torch.zeros_like(x))
    assert torch.equal(norm(x), torch.zeros_like(x))


def test_next_norms_are_linked_without_registering_modules(checkpoints):
    lm = _load(checkpoints, "tiny-deepseek-v2")
    layers = lm.model.model.layers
    names = [name for name, _ in lm.model.named_modules()]
    assert [layer.__dict__[fused_residuals.NEXT_NORM][0] for layer in layers] == [
        layers[1].input_layernorm,
        layers[2].input_layernorm,
        lm.model.model.norm,
    ]
    assert fused_residuals.link_next_norms(lm.model) == 3
    assert [name for name, _ in lm.model.named_modules()] == names  # nothing registered


def test_without_specter_norms_the_layers_run_transformers_forward(checkpoints, forced):
    # fused_norms=False keeps transformers' norm arithmetic, which add_rms_norm would not give.
    lm = _load(checkpoints, "tiny-deepseek-v2", fused_norms=False)
    assert _patched(lm) == 3
    lm.target.forward(random_prompt(4, lm.config.vocab_size, seed=6), 0)
    assert _adds(forced) == dict.fromkeys(_adds(forced), 0)


def test_the_cpu_runs_transformers_forward(checkpoints, monkeypatch):
    calls = []
    monkeypatch.setattr(fused_residuals, "add_rms_norm", lambda *a: calls.append(a))
    lm = _load(checkpoints, "tiny-qwen2-moe")
    lm.target.forward(random_prompt(4, lm.config.vocab_size, seed=7), 0)
    assert calls == []  # CPU tensors: fused_applies is False
