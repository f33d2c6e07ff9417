"""Fused gate_up MLPs: every DeepseekV2MLP / Qwen2MoeMLP runs one GEMM over its concatenated
gate and up weights and one silu_and_mul, with the same weights, the same logits, and rows
that stay bit-identical under batch invariance."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import specter_models.fused_mlp as fused_mlp
from model_helpers import (
    in_scalar_aten,
    random_prompt,
    record_invariant_gemms,
    rows_alone,
    rows_together,
)
from specter_models.loader import load_model

# The loader installs the fused MLPs itself (fused_mlp=True, the default): these tests install
# them by hand, so they load unfused models.
UNFUSED = {"fused_mlp": False}
# DeepSeek-V2: the first dense layer and each MoE layer's shared experts (3 layers, the first
# dense); Qwen2-MoE: each layer's shared expert (2 layers); PhiMoE: none (no SwiGLU MLP).
EXPECTED_MLPS = {"tiny-deepseek-v2": 3, "tiny-qwen2-moe": 2, "tiny-phimoe": 0}


def _load(checkpoints, name: str, dtype: torch.dtype = torch.float32, **kwargs):
    return load_model(checkpoints[name], device="cpu", dtype=dtype, **UNFUSED, **kwargs)


def _swiglu_mlps(model: torch.nn.Module) -> list[torch.nn.Module]:
    return [m for m in model.modules() if type(m).__name__ in fused_mlp.FUSED_MLP_CLASSES]


@pytest.mark.parametrize("name", list(EXPECTED_MLPS))
def test_every_swiglu_mlp_is_fused_once(checkpoints, name):
    lm = _load(checkpoints, name)
    mlps = _swiglu_mlps(lm.model)
    assert len(mlps) == EXPECTED_MLPS[name]
    assert all(fused_mlp.is_fusable_mlp(m) for m in mlps)
    assert fused_mlp.install_fused_gate_up(lm.model, lm.runtime) == EXPECTED_MLPS[name]
    assert all(getattr(m, "_specter_fused_gate_up", False) for m in mlps)
    assert fused_mlp.install_fused_gate_up(lm.model, lm.runtime) == 0  # already fused


def test_the_dense_layer_and_the_shared_experts_are_the_fused_ones(checkpoints):
    lm = _load(checkpoints, "tiny-deepseek-v2")
    fused_mlp.install_fused_gate_up(lm.model, lm.runtime)
    layers = lm.model.model.layers
    assert layers[0].mlp._specter_fused_gate_up  # first_k_dense_replace = 1
    assert all(layer.mlp.shared_experts._specter_fused_gate_up for layer in layers[1:])


@pytest.mark.parametrize("name", ["tiny-deepseek-v2", "tiny-qwen2-moe"])
def test_gate_and_up_weights_are_views_of_one_tensor(checkpoints, name):
    lm = _load(checkpoints, name)
    before = {key: value.clone() for key, value in lm.model.state_dict().items()}
    names_before = [key for key, _ in lm.model.named_parameters()]
    fused_mlp.install_fused_gate_up(lm.model, lm.runtime)
    for module in _swiglu_mlps(lm.model):
        gate_up = module._specter_gate_up
        gate, up = module.gate_proj.weight, module.up_proj.weight
        intermediate, hidden = gate.shape
        assert gate_up.shape == (2 * intermediate, hidden)
        assert gate.data_ptr() == gate_up.data_ptr()
        assert up.data_ptr() == gate_up[intermediate:].data_ptr()
        assert gate.untyped_storage().data_ptr() == gate_up.untyped_storage().data_ptr()
        assert up.untyped_storage().data_ptr() == gate_up.untyped_storage().data_ptr()
        assert isinstance(gate, torch.nn.Parameter)
        assert not gate.requires_grad
    after = lm.model.state_dict()
    assert list(after) == list(before)  # same names, nothing added (gate_up is no buffer)
    assert all(torch.equal(after[key], before[key]) for key in before)
    assert [key for key, _ in lm.model.named_parameters()] == names_before


@pytest.mark.parametrize("name", ["tiny-deepseek-v2", "tiny-qwen2-moe"])
@pytest.mark.parametrize(
    ("dtype", "activation", "tolerance"),
    [(torch.float32, "silu_and_mul", 1e-5), (torch.float64, "silu_and_mul_reference", 1e-12)],
)
def test_fused_logits_equal_the_unfused_ones(
    checkpoints, monkeypatch, name, dtype, activation, tolerance
):
    # float32 takes silu_and_mul (on the CPU its torch reference), float64 the plain expression.
    monkeypatch.setenv("SPECTER_KERNELS_BACKEND", "torch")
    prompt = random_prompt(7, 96, seed=5)
    lm = _load(checkpoints, name, dtype)
    unfused = lm.target.forward(prompt, 0)
    lm.reset()
    fused_mlp.install_fused_gate_up(lm.model, lm.runtime)
    calls = []
    plain = getattr(fused_mlp, activation)
    with monkeypatch.context() as patch:
        patch.setattr(fused_mlp, activation, lambda h: calls.append(h.shape) or plain(h))
        fused = lm.target.forward(prompt, 0)
    widths = sorted(m._specter_gate_up.shape[0] for m in _swiglu_mlps(lm.model))
    assert sorted(shape[-1] for shape in calls) == widths  # each fused MLP ran once
    assert fused.abs().max() > 0
    torch.testing.assert_close(fused, unfused, rtol=tolerance, atol=tolerance)


def test_weights_not_yet_loaded_are_refused(checkpoints):
    lm = _load(checkpoints, "tiny-qwen2-moe")
    mlp = _swiglu_mlps(lm.model)[0]
    mlp.gate_proj.weight = torch.nn.Parameter(torch.empty_like(mlp.gate_proj.weight, device="meta"))
    mlp.up_proj.weight = torch.nn.Parameter(torch.empty_like(mlp.up_proj.weight, device="meta"))
    with pytest.raises(ValueError, match=r"meta device.*after the weights are loaded"):
        fused_mlp.install_fused_gate_up(lm.model, lm.runtime)


def test_other_activations_are_left_alone(checkpoints):
    lm = _load(checkpoints, "tiny-qwen2-moe")
    mlp = _swiglu_mlps(lm.model)[0]
    mlp.act_fn = torch.nn.GELU()
    assert not fused_mlp.is_fusable_mlp(mlp)
    assert (
        fused_mlp.install_fused_gate_up(lm.model, lm.runtime) == EXPECTED_MLPS["tiny-qwen2-moe"] - 1
    )
    assert not getattr(mlp, "_specter_fused_gate_up", False)


@pytest.mark.parametrize("name", ["tiny-deepseek-v2", "tiny-qwen2-moe"])
def test_fused_rows_are_bit_identical_whatever_the_row_count(checkpoints, name):
    in_scalar_aten(Path(__file__).stem, "check_fused_rows_bit_identical", str(checkpoints[name]))


def check_fused_rows_bit_identical(checkpoint: str) -> None:
    torch.set_num_threads(1)
    lm = load_model(checkpoint, device="cpu", dtype=torch.float32, batch_invariant=True, **UNFUSED)
    prompt = random_prompt(6, lm.config.vocab_size, seed=3)
    rows = random_prompt(5, lm.config.vocab_size, seed=4)
    unfused = rows_together(lm, prompt, rows)
    assert fused_mlp.install_fused_gate_up(lm.model, lm.runtime) > 0
    gate_ups = {m._specter_gate_up.data_ptr() for m in _swiglu_mlps(lm.model)}
    invariant_gemms = record_invariant_gemms(gate_ups)  # the fused gate/up GEMMs only
    together = rows_together(lm, prompt, rows)
    alone = rows_alone(lm, prompt.shape[1], rows)
    # One invariant gate_up GEMM per fused MLP and forward: the prompt, the rows together,
    # then each row alone.
    assert len(invariant_gemms) == (2 + rows.shape[1]) * len(_swiglu_mlps(lm.model))
    assert torch.equal(together, alone)
    torch.testing.assert_close(together, unfused, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["tiny-deepseek-v2", "tiny-qwen2-moe", "tiny-phimoe"])
def test_load_fuses_by_default(checkpoints, name):
    lm = load_model(checkpoints[name], device="cpu", dtype=torch.float32)
    fused = [m for m in lm.model.modules() if getattr(m, "_specter_fused_gate_up", False)]
    assert len(fused) == EXPECTED_MLPS[name]
    assert fused_mlp.install_fused_gate_up(lm.model, lm.runtime) == 0
