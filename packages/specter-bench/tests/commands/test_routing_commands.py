"""``specter record-routing`` then ``specter policy-replay`` on a tiny preset, on the CPU."""

import pytest
import torch

from specter_bench.cli import main


@pytest.fixture(scope="module")
def dump_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("routing") / "routing.pt"
    base = ["record-routing", "--model", "tiny-deepseek-v2", "--max-new-tokens", "4"]
    base += ["--lookahead", "2", "--device", "cpu", "--out", str(path)]
    assert main([*base, "--num-prompts", "2"]) == 0
    assert main([*base, "--num-prompts", "1", "--append"]) == 0
    return path


def test_record_routing_dumps_a_trace_of_whole_sequences(dump_path):
    dump = torch.load(dump_path, weights_only=True)
    assert dump["model"] == "tiny-deepseek-v2"
    assert dump["format"] == "specter-routing-trace"
    # Two prompts, then the first one again from --append.
    assert dump["prompt_ids"] == ["HumanEval/0", "HumanEval/1", "HumanEval/0"]
    assert dump["prompt_sources"] == ["humaneval"] * 3
    assert torch.equal(dump["tokens"][0], dump["tokens"][2])
    for tokens, target, draft, agree, length in zip(
        dump["tokens"], dump["target"], dump["draft"], dump["agree"], dump["prompt_lens"],
        strict=True,
    ):  # fmt: skip
        # The prompt, the 4 new tokens and the 2 of the lookahead, each routed.
        assert tokens.shape == (length + 6,)
        assert target.shape == (length + 6, 2, 2)
        assert target.shape == draft.shape
        assert target.dtype == torch.uint8
        assert agree.shape == tokens.shape


def test_policy_replay_prints_every_policy_with_belady_lowest(capsys, dump_path):
    argv = ["policy-replay", str(dump_path), "--slots", "6", "--hot", "3", "--calibration", "0"]
    assert main([*argv, "--prior", "1", "--decay", "0.99", "--horizons", "2"]) == 0
    out, err = capsys.readouterr()
    assert "over 2 prompts (slots 6 a layer, hot 3)" in out
    rows = {
        line.split("|")[1].strip(): float(line.split("|")[2])
        for line in out.splitlines()
        if line.startswith("| ") and not line.startswith("| policy")
    }
    assert set(rows) >= {"pinned-calib", "pinned-prompt a=1.0", "lfu decay=0.99 a=0.0", "belady"}
    assert all(
        rows["belady"] <= v for k, v in rows.items() if k.split()[0] in ("pinned-calib", "lfu")
    )
    assert err.count("HumanEval/") == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--slots", "4", "--hot", "4"], "--hot 4 must be >= 0 and below --slots 4"),
        (["--calibration", "7"], "prompt indices [7] are outside the dump's 3 prompts"),
        (["--calibration", "a,b"], "expected comma-separated prompt indices"),
        (["--decay", "1.5"], "expected a decay in (0, 1]"),
    ],
)
def test_policy_replay_bad_arguments(capsys, dump_path, argv, message):
    assert main(["policy-replay", str(dump_path), *argv]) == 2
    assert message in capsys.readouterr().err


def test_missing_dump_and_output_folder_are_named(capsys, tmp_path):
    assert main(["policy-replay", str(tmp_path / "none.pt")]) == 2
    assert "write one with `specter record-routing`" in capsys.readouterr().err
    argv = ["record-routing", "--device", "cpu", "--out", str(tmp_path / "no" / "r.pt")]
    assert main(argv) == 2
    assert "does not exist; create it first" in capsys.readouterr().err


def test_append_refuses_another_model_and_a_missing_trace(capsys, dump_path, tmp_path):
    argv = ["record-routing", "--num-prompts", "1", "--max-new-tokens", "2", "--device", "cpu"]
    assert main([*argv, "--model", "tiny-qwen2-moe", "--out", str(dump_path), "--append"]) == 2
    assert "holds tiny-deepseek-v2's routing (2 MoE layers" in capsys.readouterr().err
    missing = str(tmp_path / "none.pt")
    assert main([*argv, "--model", "tiny-qwen2-moe", "--out", missing, "--append"]) == 2
    assert "record it first without --append" in capsys.readouterr().err
