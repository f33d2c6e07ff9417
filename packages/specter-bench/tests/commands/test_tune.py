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
