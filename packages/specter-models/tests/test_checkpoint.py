"""Checkpoint folders: shard lookup, key renames, expert sources in both layouts."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from specter_cache.expert_store import TensorSlice
from specter_models import architecture_for, get_preset
from specter_models.architecture import find_moe_layers
from specter_models.checkpoint import CheckpointFiles, expert_sources
from specter_models.model_builder import build_on_meta


def test_sharded_index_finds_every_key_and_reads_it(tmp_path):
    a = {"x": torch.arange(6.0).reshape(2, 3)}
    b = {"y": torch.ones(4, dtype=torch.float16)}
    save_file(a, tmp_path / "model-00001-of-00002.safetensors")
    save_file(b, tmp_path / "model-00002-of-00002.safetensors")
    index = {
        "weight_map": {
            "x": "model-00001-of-00002.safetensors",
            "y": "model-00002-of-00002.safetensors",
        }
    }
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    files = CheckpointFiles(tmp_path)
    assert sorted(files.names()) == ["x", "y"]
    assert "x" in files
    assert "z" not in files
    assert files.shape("x") == (2, 3)
    assert files.dtype("y") == torch.float16
    torch.testing.assert_close(files.read("x"), a["x"])
    out = torch.empty(4, dtype=torch.float64)
    files.read_into("y", out)  # converts dtype while copying
    assert out.tolist() == [1.0] * 4
    with pytest.raises(KeyError, match="no tensor 'z'"):
        files.path("z")
    files.close()


def test_index_naming_a_missing_file_or_key_is_refused(tmp_path):
    save_file({"x": torch.zeros(1)}, tmp_path / "a.safetensors")
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"x": "b.safetensors"}})
    )
    with pytest.raises(ValueError, match="not in"):
        CheckpointFiles(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": "a.safetensors"}})
    )
    with pytest.raises(ValueError, match="lacks them"):
        CheckpointFiles(tmp_path)


def test_phimoe_names_are_renamed_like_transformers():
    arch = architecture_for("phimoe")
    assert (
        arch.model_key("model.layers.3.block_sparse_moe.gate.weight")
        == "model.layers.3.mlp.router.weight"
    )
    assert (
        arch.model_key("model.layers.3.self_attn.q_proj.bias")
        == "model.layers.3.self_attn.q_proj.bias"
    )
    keys = arch.expert_keys(2, 5)
    assert keys == {
        "gate": "model.layers.2.block_sparse_moe.experts.5.w1.weight",
        "up": "model.layers.2.block_sparse_moe.experts.5.w3.weight",
        "down": "model.layers.2.block_sparse_moe.experts.5.w2.weight",
    }
    assert arch.is_expert_key(keys["down"])
    assert not arch.is_expert_key("model.layers.2.block_sparse_moe.gate.weight")
    qwen = architecture_for("qwen2_moe")
    assert not qwen.is_expert_key("model.layers.0.mlp.shared_expert.up_proj.weight")
    assert not architecture_for("deepseek_v2").is_expert_key(
        "model.layers.1.mlp.shared_experts.up_proj.weight"
    )


def test_expert_sources_join_gate_and_up_or_index_stacks(tmp_path):
    config = get_preset("tiny-qwen2-moe").make_config()
    arch = architecture_for(config)
    layers = find_moe_layers(build_on_meta(arch, config, torch.float32))
    H, I = 64, 32
    per_expert = {}
    for e in range(8):
        for name, shape in (("gate", (I, H)), ("up", (I, H)), ("down", (H, I))):
            per_expert[arch.expert_keys(0, e)[name]] = torch.zeros(shape)
    stacked = {
        "model.layers.1.mlp.experts.gate_up_proj": torch.zeros(8, 2 * I, H),
        "model.layers.1.mlp.experts.down_proj": torch.zeros(8, H, I),
    }
    save_file({**per_expert, **stacked}, tmp_path / "model.safetensors")
    files = CheckpointFiles(tmp_path)
    sources = expert_sources(files, arch, layers)
    gate_up = sources[(0, 3, "gate_up")]
    assert [s.key for s in gate_up] == [
        arch.expert_keys(0, 3)["gate"],
        arch.expert_keys(0, 3)["up"],
    ]
    assert sources[(1, 3, "down")] == TensorSlice(
        files.path("model.layers.1.mlp.experts.down_proj"),
        "model.layers.1.mlp.experts.down_proj",
        index=3,
    )
    assert len(sources) == 2 * 8 * 2
