"""``specter serve``'s command line: options checked before anything loads."""

from __future__ import annotations

import socket

import pytest

from specter_bench.cli import main


def test_help_lists_the_endpoints(capsys):
    assert main(["serve", "--help"]) == 0
    out = capsys.readouterr().out
    for words in (
        "/v1/completions", "--api-key", "--max-queue", "--max-batch", "--measure", "127.0.0.1",
    ):  # fmt: skip
        assert words in out


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--port", "-1"], "expected an int >= 0"),
        (["--max-queue", "x"], "expected an int >= 0"),
        (["--max-batch", "0"], "expected an int >= 1"),
        (["--request-timeout", "-3"], "seconds > 0"),
        (["--api-key", ""], "--api-key is empty"),
        (["--api-key-file", "/no/such/key"], "/no/such/key: no such file"),
        (["--chat-template", "/no/such/template.jinja"], "no such file"),
        (["--api-key", "a", "--api-key-file", "b"], "not both"),
    ],
)
def test_bad_options_exit_2_naming_the_value(capsys, argv, words):
    assert main(["serve", *argv]) == 2
    assert words in capsys.readouterr().err


def test_a_taken_port_is_a_clear_error(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err
    assert "choose another --port" in err


def _prompt_file(tmp_path, *prompts):
    import json

    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts), encoding="utf-8")
    return str(path)


def test_measure_skips_prompts_longer_than_the_model_holds(tmp_path, capsys):
    # tiny-deepseek-v2 holds 512 positions; its byte tokenizer makes a 600-character prompt
    # 600 tokens, which the server would refuse mid-measurement.
    path = _prompt_file(tmp_path, "def add(a, b):", "x" * 600)
    argv = ["serve", "--measure", "--model", "tiny-deepseek-v2", "--prompts", "jsonl"]
    argv += ["--prompts-path", path, "--max-new-tokens", "4", "--depth", "2"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "skips 1 prompt(s) longer than" in captured.out + captured.err
    assert "1 prompts x 4 new tokens" in captured.out


def test_measure_without_a_prompt_that_fits_is_a_clear_error(tmp_path, capsys):
    path = _prompt_file(tmp_path, "y" * 700)
    argv = ["serve", "--measure", "--model", "tiny-deepseek-v2", "--prompts", "jsonl"]
    argv += ["--prompts-path", path, "--max-new-tokens", "4"]
    assert main(argv) == 2
    assert "no prompt fits tiny-deepseek-v2's" in capsys.readouterr().err
