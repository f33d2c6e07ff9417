"""specter tune: its arguments, and a clear refusal without a CUDA GPU."""

import pytest
import torch

from specter_bench.cli import build_parser, main


def test_tune_parses_the_kernel_the_model_and_write_config():
    args = build_parser().parse_args(["tune", "gemv", "--model", "qwen1.5-moe", "--write-config"])
    assert (args.kernel, args.model, args.write_config) == ("gemv", "qwen1.5-moe", "")
    args = build_parser().parse_args(["tune", "int4", "--write-config", "f.json"])
    assert (args.kernel, args.write_config, args.device) == ("int4", "f.json", "cuda")
    assert build_parser().parse_args(["tune", "matmul"]).write_config is None


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_tune_refuses_without_a_cuda_gpu(capsys):
    assert main(["tune", "gemv", "--model", "tiny-deepseek-v2"]) == 2
    err = capsys.readouterr().err
    assert "specter tune: error:" in err
    assert "CUDA GPU" in err


def test_tune_refuses_a_device_that_is_not_cuda(capsys):
    assert main(["tune", "matmul", "--device", "cpu"]) == 2
    assert "--device must be cuda or cuda:N, got 'cpu'" in capsys.readouterr().err


def test_tune_refuses_an_unknown_kernel(capsys):
    assert main(["tune", "attention"]) == 2
    assert "invalid choice: 'attention'" in capsys.readouterr().err


def test_shapes_are_parsed_as_n_by_k(capsys):
    args = build_parser().parse_args(["tune", "gemv", "--shapes", "3648x2048, 64X2048"])
    assert args.shapes == [(3648, 2048), (64, 2048)]
    assert main(["tune", "gemv", "--shapes", "3648*2048"]) == 2
    assert "'3648*2048' is not a linear shape; expected NxK" in capsys.readouterr().err


def test_tune_writes_each_shape_to_the_tuned_file_as_it_ends(tmp_path, monkeypatch, capsys):
    # The CUDA parts stand in: the device check, the GPU's name, the timer and the tuning
    # of one shape (which tests/tuning covers); the command's printing and writing are real.
    from specter_bench.commands import tune
    from specter_bench.tuning import model_tuning, trials
    from specter_kernels.invariant import matmul_config

    class Result:
        def __init__(self, shape):
            self.trials = [trials.Trial("bad", "wrong"), trials.Trial("good", None, {"m1": 1})]
            self.entry = {"N": shape.N, "K": shape.K, "dtype": "float16", "block_n": 16,
                          "block_k": 64, "num_warps": 4, "num_stages": 3}  # fmt: skip

    monkeypatch.setattr(tune, "_cuda_device", lambda text: torch.device("cpu"))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake GPU")
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: None)
    monkeypatch.setattr(trials, "cuda_graph_timer", lambda: None)
    monkeypatch.setattr(model_tuning, "tune_matmul_shape", lambda shape, *a, **k: Result(shape))
    monkeypatch.setattr(matmul_config, "TUNED_DIR", tmp_path)
    argv = ["tune", "matmul", "--model", "tiny-deepseek-v2", "--shapes", "96x64,64x64"]
    assert main([*argv, "--write-config"]) == 0
    out = capsys.readouterr().out
    assert "matmul tiles of tiny-deepseek-v2 on Fake GPU:" in out
    assert "  q_proj: 2 tried, 1 refused -> {'N': 96" in out
    assert f"wrote 2 tuned entries to {tmp_path / 'invariant_matmul_fake_gpu.json'}" in out
    table = matmul_config._tuned_table(tmp_path / "invariant_matmul_fake_gpu.json")
    assert set(table) == {(96, 64, "float16"), (64, 64, "float16")}
