"""The specter command line: dispatch, the default command, bad arguments fail clearly."""

import re
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
    assert re.search(r"experts held on the GPU per layer +3 of 8\n", out)
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
        (["generate", "--prompt-file", "/no/such/file"], "--prompt-file /no/such/file: no such"),
        (["generate", "--prompt-file", "/"], "--prompt-file /: is a folder; give a text file"),
        (
            ["generate", "--model", "tiny-qwen2-moe", "--draft", "/no/gptq", "--depth", "2", "x"],
            "/no/gptq",
        ),
        (["generate", "--top-p", "1.5", "x"], "--top-p must be in (0, 1], got '1.5'"),
        (["generate", "--top-k", "-2", "x"], "expected an int >= 0, got '-2'"),
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


@pytest.mark.parametrize("word", ["genrate", "generat", "bnech", "inf0"])
def test_a_mistyped_command_is_an_error_with_the_closest_command(capsys, word):
    code, out, err = _run(capsys, word, "--max-new-tokens", "5")
    assert code == 2
    assert out == ""
    closest = {"genrate": "generate", "generat": "generate", "bnech": "bench", "inf0": "info"}
    assert f"unknown command {word!r}: did you mean {closest[word]}?" in err
    assert f"specter generate {word}" in err  # how to give a one-word prompt


def test_an_unknown_word_lists_the_commands_and_prompts_with_spaces_still_generate(capsys):
    code, _, err = _run(capsys, "hello")
    assert code == 2
    assert "unknown command 'hello': commands: generate, bench" in err
    code, _, err = _run(capsys, "--model", "tiny-qwen2-moe", "--top-p", "2", "def f():")
    assert code == 2  # the prompt "def f():" went to generate, whose --top-p refused 2
    assert "--top-p must be in (0, 1]" in err


def test_an_argument_error_is_one_line_and_a_hint_not_the_usage(capsys):
    code, _, err = _run(capsys, "generate", "--depth", "deep")
    assert code == 2
    assert err.splitlines() == [
        "specter generate: error: argument --depth: depth must be an int >= 0 (0 turns "
        "speculation off) or 'auto', got 'deep'",
        "(see specter generate --help)",
    ]


def test_sampling_arguments_are_checked_before_torch_loads():
    code = (
        "import sys; from specter_bench.cli import main; "
        "status = main(['generate', '--top-p', '0', 'x']); "
        "assert status == 2; assert 'torch' not in sys.modules, 'torch was imported'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "--top-p must be in (0, 1]" in done.stderr
