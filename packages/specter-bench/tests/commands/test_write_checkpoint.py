"""specter write-checkpoint: a preset's weights on disk from the command line, and one-line
errors."""

from specter_bench.cli import main
from specter_models.checkpoint_writer import read_marker


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_writes_the_folder_and_refuses_to_overwrite_it(capsys, tmp_path):
    out = tmp_path / "tiny"
    argv = ("write-checkpoint", "--model", "tiny-qwen2-moe", "--weights-seed", "5")
    code, stdout, _ = _run(capsys, *argv, "--device", "cpu", "--out", str(out))
    assert code == 0
    assert f"wrote {out}" in stdout
    marker = read_marker(out)
    assert (marker["preset"], marker["seed"], marker["dtype"]) == ("tiny-qwen2-moe", 5, "float16")
    code, _, err = _run(capsys, *argv, "--device", "cpu", "--out", str(out))
    assert code == 2
    assert "already exists and is not an empty folder" in err
    assert "Traceback" not in err


def test_bad_arguments_are_one_line_errors(capsys, tmp_path):
    code, _, err = _run(capsys, "write-checkpoint", "--model", "llama-7b", "--out", str(tmp_path))
    assert code == 2
    assert "is not a preset" in err
    code, _, err = _run(
        capsys,
        "write-checkpoint",
        "--model",
        "tiny-qwen2-moe",
        "--out",
        str(tmp_path / "a"),
        "--max-shard-gb",
        "0",
    )
    assert code == 2
    assert "--max-shard-gb must be > 0" in err
