"""Architecture table: supported types, KV row shapes, MoE layer discovery, refused configs."""

from __future__ import annotations

import pytest
import torch

from specter_models import SUPPORTED_MODEL_TYPES, architecture_for, get_preset
from specter_models.architecture import find_moe_layers
from specter_models.model_builder import build_on_meta


def test_unsupported_type_names_all_supported_ones():
    with pytest.raises(ValueError, match="mixtral") as info:
        architecture_for("mixtral")
    assert all(t in str(info.value) for t in SUPPORTED_MODEL_TYPES)


def test_kv_row_shapes():
    ds = get_preset("deepseek-v2-lite").make_config()
    assert architecture_for(ds).kv_row_shapes(ds) == ((1, 512), (1, 64))  # MLA latents
    phi = get_preset("phi-3.5-moe").make_config()
    assert architecture_for(phi).kv_row_shapes(phi) == ((8, 128), (8, 128))
    qwen = get_preset("qwen1.5-moe").make_config()
    assert architecture_for(qwen).kv_row_shapes(qwen) == ((16, 128), (16, 128))


def test_moe_layers_skip_dense_layers():
    config = get_preset("tiny-deepseek-v2").make_config()
    layers = find_moe_layers(build_on_meta(architecture_for(config), config, torch.float32))
    assert [(m.index, m.decoder_layer) for m in layers] == [(0, 1), (1, 2)]
    assert (layers[0].num_experts, layers[0].hidden_size, layers[0].intermediate_size) == (
        8,
        64,
        32,
    )


def test_refused_configurations():
    config = get_preset("tiny-qwen2-moe").make_config()
    config.hidden_act = "gelu"
    with pytest.raises(ValueError, match="silu"):
        architecture_for(config).check_config(config, 128)
    phi = get_preset("tiny-phimoe").make_config()
    phi.sliding_window = 64
    with pytest.raises(ValueError, match="sliding_window=64"):
        architecture_for(phi).check_config(phi, 128)
    architecture_for(phi).check_config(phi, 64)  # a window that never binds is fine
