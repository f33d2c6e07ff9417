"""``specter train``: argument errors, and a 3-step CPU run whose checkpoint loads."""

import json
import math

import pytest
import torch

from specter_bench.cli import main

TINY = [
    "--steps", "3", "--max-files", "12", "--heldout-fraction", "0.25", "--batch-size", "2",
    "--seq-len", "32", "--vocab-size", "300", "--evals", "1", "--eval-windows", "2",
    "--log-every", "1", "--warmup-steps", "1", "--max-new-tokens", "2", "--device", "cpu",
]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--arch", "gpt-tiny"], "invalid choice: 'gpt-tiny'"),
        (["--seq-len", "4096"], "--seq-len=4096 exceeds the position limit 1024"),
        (["--vocab-size", "100", "--steps", "1"], "--vocab-size=100 is too small"),
        (["--experts-impl", "fast"], "invalid choice: 'fast'"),
    ],
)
def test_bad_arguments_fail_with_a_clear_message(capsys, tmp_path, argv, message):
    assert main(["train", "--out", str(tmp_path / "run"), "--device", "cpu", *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_non_empty_output_folder_needs_overwrite(capsys, tmp_path):
    (tmp_path / "README.md").write_text("an earlier run")
    assert main(["train", "--out", str(tmp_path), "--smoke"]) == 2
    assert "is not empty; pass --overwrite" in capsys.readouterr().err


def test_three_steps_train_a_finite_model_whose_checkpoint_loads(capsys, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "tiny"
    code = main(["train", "--out", str(out), *TINY])
    assert code in (0, 1), capsys.readouterr().err  # 1: a self-check failed after 3 steps
    records = [json.loads(line) for line in (out / "training_log.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if r["event"] == "train"]
    assert len(losses) == 3
    assert all(math.isfinite(x) for x in losses)
    summary = records[-1]
    assert summary["event"] == "summary"
    assert summary["steps"] == 3
    assert summary["reproduce"].startswith("specter train ")
    assert summary["reproduce"].endswith("--steps 3 --out OUT")
    assert (out / "README.md").read_text().startswith("---")

    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(out)
    ids = tokenizer("def f(x):", return_tensors="pt")["input_ids"]
    logits = model(input_ids=ids).logits
    assert type(model).__name__ == "DeepseekV2ForCausalLM"
    assert logits.shape == (1, ids.shape[1], len(tokenizer))
    assert torch.isfinite(logits).all()
