"""One kernel over a model's shapes: every shape tuned (the GEMV's eligible ones), and the
file written where the config modules read it, other shapes' entries kept."""

import json

import pytest

import specter_kernels.invariant.matmul_config as mc
from specter_bench.tuning import model_tuning
from specter_bench.tuning.linear_shapes import linear_shapes
from specter_bench.tuning.model_tuning import tune_model, tuned_path, write_tuned
from specter_models.engine.model_source import model_config


def test_tuned_paths_are_the_ones_the_config_modules_read():
    assert tuned_path("gemv", "NVIDIA H200").name == "invariant_gemv_nvidia_h200.json"
    assert tuned_path("matmul", "NVIDIA H200") == mc.tuned_config_path("NVIDIA H200")
    assert tuned_path("int4", "NVIDIA H200").name == "w4a16_gemv_nvidia_h200.json"


def test_every_shape_is_tuned_and_written_keeping_other_entries(tmp_path, monkeypatch):
    config = model_config("tiny-deepseek-v2")
    seen = []

    def fake_shape_tuning(shape, device, timer, *, gpu_name, progress):
        seen.append(shape)
        entry = {"N": shape.N, "K": shape.K, "dtype": str(shape.dtype)[6:], "block_n": 16,
                 "block_k": 64, "num_warps": 4, "num_stages": 3, "split_k": 1}  # fmt: skip
        return type("Result", (), {"entry": entry})()

    monkeypatch.setattr(model_tuning, "tune_matmul_shape", fake_shape_tuning)
    names = []
    results = tune_model("matmul", config, "cpu", lambda launch: 1.0, on_shape=names.append)
    assert seen == linear_shapes(config)
    assert names == [s.name for s in seen]
    path = tmp_path / "tuned.json"
    other = {"N": 7, "K": 8, "dtype": "float16", "block_n": 16, "block_k": 16, "num_warps": 4,
             "num_stages": 3}  # fmt: skip
    path.write_text(json.dumps({"configs": [other]}))
    assert write_tuned("matmul", results, path, "Fake GPU", "specter tune matmul") == (
        len(seen),
        1,
    )
    table = json.loads(path.read_text())
    assert table["device"] == "Fake GPU"
    assert table["source"].startswith("specter tune matmul (")
    assert table["configs"][-1] == other
    first = seen[0]
    assert mc._tuned_table(path)[(first.N, first.K, "float16")].block_k == 64


def test_the_gemv_skips_shapes_it_cannot_take(monkeypatch):
    tuned = []
    monkeypatch.setattr(model_tuning, "tune_gemv_shape", lambda shape, *a, **k: tuned.append(shape))
    # specter-code-tiny's shapes all have K a multiple of 8; pretend one is not eligible
    monkeypatch.setattr(model_tuning.gemv_config, "gemv_eligible", lambda K, dtype: K != 64)
    tune_model("gemv", model_config("specter-code-tiny"), "cpu", lambda launch: 1.0)
    assert tuned
    assert all(s.K != 64 for s in tuned)


def test_an_unknown_kernel_is_refused():
    with pytest.raises(ValueError, match="kernel must be one of"):
        tune_model("attention", model_config("tiny-deepseek-v2"), "cpu", lambda launch: 1.0)


def test_only_the_named_shapes_are_tuned_and_unknown_ones_are_refused(monkeypatch):
    tuned, ended = [], []
    monkeypatch.setattr(
        model_tuning, "tune_matmul_shape", lambda shape, *a, **k: tuned.append(shape) or shape
    )
    config = model_config("tiny-deepseek-v2")
    tune_model("matmul", config, "cpu", lambda launch: 1.0, only=[(96, 64)], on_result=ended.append)
    assert [(s.N, s.K) for s in tuned] == [(96, 64)]
    assert ended == tuned
    with pytest.raises(ValueError, match=r"no matmul shapes \[\(5, 7\)\].*96x64 \(q_proj\)"):
        tune_model("matmul", config, "cpu", lambda launch: 1.0, only=[(5, 7)])
    with pytest.raises(ValueError, match="routed-expert layer shape"):
        tune_model("int4", config, "cpu", lambda launch: 1.0, only=[(96, 64)])
