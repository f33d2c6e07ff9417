"""Tuned tile files: the writer keeps other shapes' entries, and what it writes reads back
through each config module as the same tiles."""

import json

import pytest
import torch

import specter_kernels.invariant.gemv_config as gc
import specter_kernels.invariant.matmul_config as mc
from specter_kernels.invariant.gemv_config import InvariantGemvConfig
from specter_kernels.invariant.matmul_config import BLOCK_M, MatmulConfig
from specter_kernels.moe import w4a16_configs as wc
from specter_kernels.moe.w4a16_triton import GemvConfig
from specter_kernels.tuned_files import device_slug, read_tuned_entries, write_tuned_file


def test_the_writer_replaces_equal_keys_and_keeps_the_others(tmp_path):
    path = tmp_path / "sub" / "f.json"
    old = [{"N": 1, "K": 8, "dtype": "float16", "x": 1}, {"N": 2, "K": 8, "dtype": "float16"}]
    write_tuned_file(path, "GPU A", old, key_fields=("N", "K", "dtype"), source="first")
    new = [{"N": 2, "K": 8, "dtype": "float16", "x": 2}, {"N": 3, "K": 8, "dtype": "float32"}]
    written = write_tuned_file(path, "GPU A", new, key_fields=("N", "K", "dtype"), source="s")
    assert written == [*new, old[0]]
    table = json.loads(path.read_text())
    assert (table["device"], table["source"]) == ("GPU A", "s")
    assert table["torch"] == torch.__version__
    assert read_tuned_entries(path) == written
    with pytest.raises(ValueError, match=r"lacks the key fields \['dtype'\]"):
        write_tuned_file(
            path, "GPU A", [{"N": 1, "K": 8}], key_fields=("N", "K", "dtype"), source=""
        )


def test_a_file_without_configs_is_reported(tmp_path):
    path = tmp_path / "f.json"
    path.write_text("{}")
    with pytest.raises(ValueError, match="not a tuned tile file"):
        read_tuned_entries(path)
    assert read_tuned_entries(tmp_path / "none.json") == []


def test_gemv_entries_round_trip_through_gemv_config(tmp_path, monkeypatch):
    monkeypatch.setattr(gc, "TUNED_DIR", tmp_path)
    tile = InvariantGemvConfig(2, 1, 4)
    entries = [
        gc.gemv_tuned_entry(96, 64, torch.float16, tile, {"gemv_graph_us_m1": 1.234}),
        gc.gemv_tuned_entry(128, 64, torch.float16, None, {"mma_graph_us_m1": 2.0}),
    ]
    assert entries[0]["gemv_graph_us_m1"] == 1.23
    write_tuned_file(gc.tuned_gemv_path("Some GPU"), "Some GPU", entries,
                     key_fields=mc.KEY_FIELDS, source="test")  # fmt: skip
    assert gc.gemv_config(96, 64, torch.float16, "Some GPU") == tile
    assert gc.gemv_config(128, 64, torch.float16, "Some GPU") is None  # the tensor-core kernel


def test_matmul_entries_round_trip_through_matmul_config(tmp_path, monkeypatch):
    monkeypatch.setattr(mc, "TUNED_DIR", tmp_path)
    tile = MatmulConfig(BLOCK_M, 32, 256, 8, 3, split_k=4)
    entry = mc.matmul_tuned_entry(2048, 1024, torch.float16, tile, {"graph_us_m1": 3.0})
    path = mc.tuned_config_path("Other GPU")
    write_tuned_file(path, "Other GPU", [entry], key_fields=mc.KEY_FIELDS, source="test")
    assert mc.matmul_config(2048, 1024, torch.float16, "Other GPU") == tile


def test_w4a16_entries_round_trip_through_w4a16_configs(tmp_path, monkeypatch):
    monkeypatch.setattr(wc, "TUNED_DIR", tmp_path)
    gate_up, down = GemvConfig(16, 256, 1, 2, 3, 3), GemvConfig(32, 64, 8, 4, 2, 3)
    entry = wc.gemv_tuned_entry(2048, 1408, 6, gate_up, down, {"layer_graph_us": 18.0})
    path = wc.tuned_gemv_path("Third GPU")
    assert path == tmp_path / "w4a16_gemv_third_gpu.json"
    write_tuned_file(path, "Third GPU", [entry], key_fields=wc.KEY_FIELDS, source="test")
    assert wc.tuned_gemv_configs(2048, 1408, 6, "Third GPU") == (gate_up, down)
    assert wc.tuned_gemv_configs(2048, 1408, 4, "Third GPU") is None  # another top_k
    assert wc.tuned_gemv_configs(2048, 1408, 6, None) is None


def test_a_broken_w4a16_file_is_reported(tmp_path, monkeypatch):
    monkeypatch.setattr(wc, "TUNED_DIR", tmp_path)
    bad = {"H": 8, "I": 8, "top_k": 1, "gate_up": {"block_n": 16, "tile": 2}, "down": {}}
    wc.tuned_gemv_path("Bad GPU").write_text(json.dumps({"configs": [bad]}))
    with pytest.raises(ValueError, match=r"not a tuned W4A16 gemv file .*unknown GemvConfig"):
        wc.tuned_gemv_configs(8, 8, 1, "Bad GPU")


def test_device_names_become_file_names():
    assert device_slug("NVIDIA H200") == "nvidia_h200"
    assert device_slug(" NVIDIA GeForce RTX 4090 ") == "nvidia_geforce_rtx_4090"
