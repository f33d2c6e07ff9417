"""Presets: full-size configurations of the three models and tiny test models."""

from __future__ import annotations

import pytest
import torch

from specter_models import FULL_SIZE_PRESETS, PRESETS, TINY_PRESETS, architecture_for, get_preset
from specter_models.architecture import find_moe_layers
from specter_models.model_builder import build_on_meta

# shared/BENCHMARK.md: parameters (measured), routed experts, top-k, MoE layers.
FULL_SIZE = {
    "deepseek-v2-lite": (15.71e9, 64, 6, 26, "deepseek_v2"),
    "qwen1.5-moe": (14.32e9, 60, 4, 24, "qwen2_moe"),
    "phi-3.5-moe": (41.87e9, 16, 2, 32, "phimoe"),
}


@pytest.mark.parametrize("name", FULL_SIZE_PRESETS)
def test_full_size_presets_match_the_benchmark_table(name):
    params, experts, top_k, moe_layers, model_type = FULL_SIZE[name]
    config = get_preset(name).make_config()
    model = build_on_meta(architecture_for(config), config, torch.float16)
    total = sum(p.numel() for p in model.parameters())
    assert abs(total - params) < 0.005e9
    layers = find_moe_layers(model)
    assert len(layers) == moe_layers
    assert {layer.num_experts for layer in layers} == {experts}
    assert config.num_experts_per_tok == top_k
    assert config.model_type == model_type
    assert get_preset(name).low_budget_gb < get_preset(name).high_budget_gb


def test_deepseek_v2_lite_shape():
    c = get_preset("deepseek-v2-lite").make_config()
    assert (c.kv_lora_rank, c.q_lora_rank, c.qk_rope_head_dim, c.qk_nope_head_dim) == (
        512,
        None,
        64,
        128,
    )
    assert (c.first_k_dense_replace, c.intermediate_size, c.n_shared_experts) == (1, 10944, 2)
    assert (c.topk_method, c.routed_scaling_factor, c.norm_topk_prob) == ("greedy", 1.0, False)


def test_tiny_presets_keep_each_architectures_structure():
    for name in TINY_PRESETS:
        config = get_preset(name).make_config()
        model = build_on_meta(architecture_for(config), config, torch.float32)
        assert config.hidden_size <= 128
        assert find_moe_layers(model)
    dsv2 = get_preset("tiny-deepseek-v2").make_config()
    assert dsv2.first_k_dense_replace == 1
    assert dsv2.kv_lora_rank
    assert dsv2.routed_scaling_factor != 1
    assert get_preset("tiny-phimoe").make_config().attention_bias


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(KeyError, match="deepseek-v2-lite"):
        get_preset("mixtral")
    assert get_preset("DeepSeek-V2-Lite") is PRESETS["deepseek-v2-lite"]
