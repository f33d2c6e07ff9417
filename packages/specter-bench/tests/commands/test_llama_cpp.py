"""specter llama-cpp: plan, bench and all from the command line, with one-line errors for
what is missing."""

from gguf_samples import deepseek_v2_lite_gguf
from llama_cpp_fakes import calls, make_build, make_source
from specter_bench.bench_record import read_records
from specter_bench.cli import main


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_plan_prints_the_choice_per_budget(capsys, tmp_path):
    gguf = deepseek_v2_lite_gguf(tmp_path / "m.gguf")
    code, out, _ = _run(
        capsys, "llama-cpp", "plan", "--gguf", str(gguf), "--gpu-memory-gb", "unlimited,24,16"
    )
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("--n-cpu-moe 0 ")
    assert lines[1].startswith("--n-cpu-moe 8 (7 MoE blocks")
    assert lines[2].startswith("--n-cpu-moe 16 (15 MoE blocks")
    code, _, err = _run(capsys, "llama-cpp", "plan", "--gguf", str(gguf), "--gpu-memory-gb", "1")
    assert code == 2
    assert "cannot hold llama.cpp's state" in err


def test_bench_writes_records_with_the_command_line(capsys, tmp_path):
    source, build = make_source(tmp_path / "src"), make_build(tmp_path / "build")
    gguf = deepseek_v2_lite_gguf(tmp_path / "dsv2-f16.gguf")
    code, _, err = _run(
        capsys,
        "llama-cpp",
        "bench",
        "--source",
        str(source),
        "--build",
        str(build),
        "--gguf",
        str(gguf),
        "--gpu-memory-gb",
        "24",
        "--prompt-tokens",
        "512",
        "--model-label",
        "deepseek-v2-lite",
        "--out",
        str(tmp_path / "out"),
        "--tag",
        "x",
        "--log-dir",
        str(tmp_path / "logs"),
    )
    assert code == 0, err
    assert "--n-cpu-moe 8" in calls(build)[0]
    records = read_records(tmp_path / "out" / "bench-deepseek-v2-lite-x.jsonl")
    assert len(records) == 3
    assert records[0]["identity"]["command"].startswith("specter llama-cpp bench --source")


def test_missing_pieces_are_one_line_errors(capsys, tmp_path):
    gguf = deepseek_v2_lite_gguf(tmp_path / "m.gguf")
    nobuild = ("--build", str(tmp_path / "nobuild"))
    code, _, err = _run(capsys, "llama-cpp", "bench", "--gguf", str(gguf), *nobuild)
    assert code == 2
    assert "llama-bench is not built" in err
    code, _, err = _run(capsys, "llama-cpp", "bench", "--gguf", str(tmp_path / "none.gguf"))
    assert code == 2
    assert "no GGUF file at" in err
    code, _, err = _run(
        capsys,
        "llama-cpp",
        "convert",
        "--source",
        str(tmp_path / "nosrc"),
        "--checkpoint",
        str(tmp_path),
        "--out",
        str(tmp_path / "o.gguf"),
    )
    assert code == 2
    assert "holds no config.json" in err or "no llama.cpp source tree" in err
    code, _, err = _run(capsys, "llama-cpp", "bench", "--gguf", str(gguf), "--speculative-only")
    assert code == 2
    assert "--speculative-only needs --draft" in err
    code, _, err = _run(capsys, "llama-cpp", "bench", "--gguf", str(gguf), "--n-cpu-moe", "some")
    assert code == 2
    assert "--n-cpu-moe takes auto or a block count" in err


def test_all_takes_full_size_presets_and_known_types(capsys):
    code, _, err = _run(capsys, "llama-cpp", "all", "--model", "tiny-qwen2-moe")
    assert code == 2
    assert "all writes a full-size preset" in err
    code, _, err = _run(capsys, "llama-cpp", "all", "--model", "qwen1.5-moe", "--types", "q8_0")
    assert code == 2
    assert "--types must include f16" in err
    code, _, err = _run(
        capsys, "llama-cpp", "all", "--model", "qwen1.5-moe", "--steps", "convert,bake"
    )
    assert code == 2
    assert "--steps takes" in err
