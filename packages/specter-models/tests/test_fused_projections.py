"""Fused MLA input projections: DeepSeek-V2's q_proj and kv_a_proj_with_mqa run as one GEMM
over one concatenated weight, with the same weights, the same logits, and rows that stay
bit-identical under batch invariance."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import specter_models.fused_projections as fused_projections
from model_helpers import (
    in_scalar_aten,
    random_prompt,
    record_invariant_gemms,
    rows_alone,
    rows_together,
)
from specter_models.loader import load_model

# The loader fuses by default: these tests fuse by hand, so they load unfused models.
UNFUSED = {"fused_projections": False}
TINY_DEEPSEEK_LAYERS = 3


def _load(checkpoints, name: str = "tiny-deepseek-v2", dtype=torch.float32, **kwargs):
    return load_model(checkpoints[name], device="cpu", dtype=dtype, **UNFUSED, **kwargs)


def _attention(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if type(m).__name__.endswith("Attention")]


def _fused(module: torch.nn.Module):
    return getattr(module, fused_projections.FUSED_ATTRIBUTE, None)


@pytest.mark.parametrize(
    ("name", "expected"),
    [("tiny-deepseek-v2", TINY_DEEPSEEK_LAYERS), ("tiny-qwen2-moe", 0), ("tiny-phimoe", 0)],
)
def test_every_mla_attention_is_fused_once(checkpoints, name, expected):
    lm = _load(checkpoints, name)
    assert fused_projections.install_fused_q_kv_a(lm.model, lm.runtime) == expected
    assert sum(_fused(m) is not None for m in _attention(lm.model)) == expected
    assert fused_projections.install_fused_q_kv_a(lm.model, lm.runtime) == 0  # already fused


def test_load_fuses_by_default_and_only_in_the_absorbed_form(checkpoints):
    fused = load_model(checkpoints["tiny-deepseek-v2"], device="cpu", dtype=torch.float32)
    assert all(_fused(m) is not None for m in _attention(fused.model))
    expanded = load_model(
        checkpoints["tiny-deepseek-v2"], device="cpu", dtype=torch.float32, absorbed_mla=False
    )
    assert not any(_fused(m) is not None for m in _attention(expanded.model))


def test_the_two_weights_are_views_of_the_fused_one(checkpoints):
    lm = _load(checkpoints)
    before = {key: value.clone() for key, value in lm.model.state_dict().items()}
    names = [key for key, _ in lm.model.named_parameters()]
    fused_projections.install_fused_q_kv_a(lm.model, lm.runtime)
    for module in _attention(lm.model):
        weight = _fused(module).weight
        q, kv = module.q_proj.weight, module.kv_a_proj_with_mqa.weight
        assert weight.shape == (q.shape[0] + kv.shape[0], q.shape[1])
        assert q.data_ptr() == weight.data_ptr()
        assert kv.data_ptr() == weight[q.shape[0] :].data_ptr()
        assert isinstance(kv, torch.nn.Parameter)
        assert not kv.requires_grad
    after = lm.model.state_dict()
    assert list(after) == list(before)  # nothing added: the fused weight is no buffer
    assert all(torch.equal(after[key], before[key]) for key in before)
    assert [key for key, _ in lm.model.named_parameters()] == names


@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_fused_logits_equal_the_unfused_ones(checkpoints, monkeypatch, dtype, tolerance):
    monkeypatch.setenv("SPECTER_KERNELS_BACKEND", "torch")
    prompt = random_prompt(9, 96, seed=5)
    lm = _load(checkpoints, dtype=dtype)
    unfused = [lm.target.forward(prompt[:, :6], 0), lm.target.forward(prompt[:, 6:], 6)]
    lm.reset()
    fused_projections.install_fused_q_kv_a(lm.model, lm.runtime)
    calls = []
    for module in _attention(lm.model):
        project = _fused(module)
        module._specter_q_kv_a = lambda x, project=project: calls.append(x.shape) or project(x)
    fused = [lm.target.forward(prompt[:, :6], 0), lm.target.forward(prompt[:, 6:], 6)]
    # Each layer's one GEMM ran in both forwards; the separate projections did not.
    assert len(calls) == 2 * TINY_DEEPSEEK_LAYERS
    assert fused[1].abs().max() > 0
    for got, expected in zip(fused, unfused, strict=True):
        torch.testing.assert_close(got, expected, rtol=tolerance, atol=tolerance)


def test_weights_not_yet_loaded_are_refused(checkpoints):
    lm = _load(checkpoints)
    module = _attention(lm.model)[0]
    for projection in (module.q_proj, module.kv_a_proj_with_mqa):
        meta = torch.empty_like(projection.weight, device="meta")
        projection.weight = torch.nn.Parameter(meta)
    with pytest.raises(ValueError, match=r"meta device.*after the weights are loaded"):
        fused_projections.install_fused_q_kv_a(lm.model, lm.runtime)


def test_a_projection_with_a_bias_is_left_alone(checkpoints):
    lm = _load(checkpoints)
    module = _attention(lm.model)[0]
    kv = module.kv_a_proj_with_mqa
    kv.bias = torch.nn.Parameter(torch.zeros(kv.out_features))
    assert not fused_projections.is_fusable_attention(module)
    assert fused_projections.install_fused_q_kv_a(lm.model, lm.runtime) == TINY_DEEPSEEK_LAYERS - 1
    assert _fused(module) is None


def test_fused_rows_are_bit_identical_whatever_the_row_count(checkpoints):
    in_scalar_aten(
        Path(__file__).stem, "check_fused_rows_bit_identical", str(checkpoints["tiny-deepseek-v2"])
    )


def check_fused_rows_bit_identical(checkpoint: str) -> None:
    torch.set_num_threads(1)
    lm = load_model(checkpoint, device="cpu", dtype=torch.float32, batch_invariant=True, **UNFUSED)
    prompt = random_prompt(6, lm.config.vocab_size, seed=3)
    rows = random_prompt(5, lm.config.vocab_size, seed=4)
    unfused = rows_together(lm, prompt, rows)
    assert fused_projections.install_fused_q_kv_a(lm.model, lm.runtime) == TINY_DEEPSEEK_LAYERS
    fused_ptrs = {_fused(m).weight.data_ptr() for m in _attention(lm.model)}
    invariant_gemms = record_invariant_gemms(fused_ptrs)
    together = rows_together(lm, prompt, rows)
    alone = rows_alone(lm, prompt.shape[1], rows)
    # One invariant GEMM per layer and forward: the prompt, the rows together, each row alone.
    assert len(invariant_gemms) == (2 + rows.shape[1]) * TINY_DEEPSEEK_LAYERS
    assert torch.equal(together, alone)
    torch.testing.assert_close(together, unfused, rtol=1e-5, atol=1e-5)
