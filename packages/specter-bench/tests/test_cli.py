"""The specter command line: dispatch, the default command, bad arguments fail clearly."""

import subprocess
import sys

import pytest
import torch

from specter_bench.cli import main


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_default_command_runs_the_demo_model_through_specter(capsys, checkpoint, monkeypatch):
    # Stand in for the shipped specter-code-tiny: `specter` with no argument loads the demo.
    import specter_models.loader
    import specter_models.presets

    monkeypatch.setattr(specter_models.presets, "demo_model_path", lambda: checkpoint)
    monkeypatch.setattr(specter_models.loader, "demo_model_path", lambda: checkpoint)
    code, out, err = _run(capsys, "--max-new-tokens", "12", "--slots-per-layer", "3")
    assert code == 0, err
    assert "loaded SpecterModel(deepseek_v2" in err
    assert "draft=int4" in err
    assert out.startswith("def fibonacci(n):")
    assert "expert slots per layer           3/8" in out
    assert "random weights" not in err  # a checkpoint with its own tokenizer


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["generate", "--depth", "deep"], "depth must be an int >= 0"),
        (["generate", "--gpu-memory-gb", "-3"], "GPU memory budget must be a number of GB > 0"),
        (["generate", "--model", "tiny-qwen2-moe", "--top-p", "0.5", "x"], "need sampling"),
        (["generate", "--model", "tiny-qwen2-moe", "--device", "tpu", "x"], "--device must be"),
        (["generate", "--model", "gpt-5", "x"], "known presets"),
        (["generate", "--model", "/no/such/ckpt", "x"], "no checkpoint folder at '/no/such/ckpt'"),
        (["generate", "--model", "tiny-qwen2-moe", "--gpu-memory-gb", "0.001", "x"], "too small"),
        (["generate", "--prompt-file", "/no/such/file"], "no such file"),
        (
            ["generate", "--model", "tiny-qwen2-moe", "--depth", "0", "--hot-experts", "auto"],
            "--depth 0 decodes without a draft",
        ),
        (
            ["generate", "--model", "tiny-qwen2-moe", "--depth", "0", "--keep-draft", "x"],
            "--depth 0 decodes plainly without one: leave --keep-draft out",
        ),
        (["bench"], "--model is required"),
        (["bench", "--model", "tiny-qwen2-moe", "--experiment", "fast"], "unknown experiment"),
        (["bench", "--model", "tiny-qwen2-moe", "--systems", "vllm"], "unknown system 'vllm'"),
        (["bench", "--model", "tiny-qwen2-moe", "--budgets", "x"], "GPU memory budget must be"),
        (["kernel-bench", "--tokens", "a,b"], "comma-separated list of ints"),
        (["bench", "--model", "tiny-qwen2-moe", "--hot-experts", "-1"], "expected an int >= 0"),
        (["bench", "--model", "tiny-qwen2-moe", "--calibration-prompts", "x"], "an int >= 0"),
        (["bench", "--model", "tiny-qwen2-moe", "--sweep-prompts", "0"], "an int >= 1"),
        (["generate", "--batch-invariant", "maybe", "x"], "expected auto, on or off"),
        (["generate", "--depth-warmup", "-1", "x"], "expected an int >= 0, got '-1'"),
        (["report", "/no/such.jsonl"], "does not exist"),
    ],
)
def test_bad_arguments_fail_with_a_clear_message(capsys, argv, message):
    code, _, err = _run(capsys, *argv)
    assert code == 2
    assert message in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a CPU-only machine")
def test_cuda_asked_for_without_a_gpu(capsys):
    code, _, err = _run(capsys, "generate", "--device", "cuda", "--model", "tiny-phimoe", "x")
    assert code == 2
    assert "torch sees no CUDA GPU" in err


def test_python_dash_m_runs_the_cli():
    done = subprocess.run(
        [sys.executable, "-m", "specter_bench", "--help"], capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0
    for command in ("generate", "bench", "profile-depth", "kernel-bench", "info", "report"):
        assert command in done.stdout
