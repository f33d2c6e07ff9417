"""invocations: the command lines run in a llama.cpp tree, and clear errors for what is
missing."""

from pathlib import Path

import pytest

from llama_cpp_fakes import make_build, make_source
from specter_bench.llama_cpp.invocations import (
    BenchSettings,
    LlamaCppError,
    LlamaCppTree,
    SpeculativeSettings,
    bench_argv,
    convert_argv,
    quantize_argv,
    run_logged,
    speculative_argv,
)


@pytest.fixture
def tree(tmp_path):
    return LlamaCppTree(make_source(tmp_path / "src"), make_build(tmp_path / "build"))


def _flag(argv, name):
    return argv[argv.index(name) + 1]


def test_bench_measures_prefill_and_decode_at_the_prompts_depth(tree):
    argv = bench_argv(
        tree, Path("m.gguf"), BenchSettings(prompt_tokens=300, new_tokens=64, repetitions=5)
    )
    assert argv[0].endswith("bin/llama-bench")
    assert _flag(argv, "-p") == "300"
    assert _flag(argv, "-n") == "64"
    assert _flag(argv, "-d") == "0,300"
    assert _flag(argv, "-r") == "5"
    assert _flag(argv, "-ngl") == "99"
    assert _flag(argv, "-o") == "json"
    assert "--n-cpu-moe" not in argv  # every expert on the GPU
    cpu = bench_argv(tree, Path("m.gguf"), BenchSettings(n_cpu_moe=8, threads=16))
    assert _flag(cpu, "--n-cpu-moe") == "8"
    assert _flag(cpu, "-t") == "16"
    assert BenchSettings(prompt_tokens=512, new_tokens=128).n_ctx == 1024


def test_speculative_is_greedy_with_the_draft_on_the_gpu(tree):
    argv = speculative_argv(
        tree,
        Path("t.gguf"),
        Path("d.gguf"),
        Path("p.txt"),
        SpeculativeSettings(new_tokens=100, draft_max=6, n_ctx=1024, n_cpu_moe=3),
    )
    assert _flag(argv, "-m") == "t.gguf"
    assert _flag(argv, "-md") == "d.gguf"
    assert _flag(argv, "--spec-type") == "draft-simple"
    assert _flag(argv, "-ngld") == "99"
    assert _flag(argv, "--spec-draft-n-max") == "6"
    assert _flag(argv, "--temp") == "0"
    assert _flag(argv, "--n-cpu-moe") == "3"
    assert _flag(argv, "--fit") == "off"
    assert "--ignore-eos" in argv
    assert "--no-escape" in argv  # HumanEval/51 holds a backslash-n that must stay two characters


def test_convert_goes_through_the_runner_and_quantize_takes_known_types(tree):
    argv = convert_argv(tree, Path("ckpt"), "f16", Path("o.gguf"), pre_tokenizer="gpt-2")
    assert argv[1:3] == ["-m", "specter_bench.llama_cpp.convert_runner"]
    assert argv[3:6] == [str(tree.source), "gpt-2", "ckpt"]
    assert _flag(argv, "--outtype") == "f16"
    with pytest.raises(ValueError, match="make other types"):
        convert_argv(tree, Path("ckpt"), "q4_0", Path("o.gguf"), pre_tokenizer=None)
    argv = quantize_argv(tree, Path("a.gguf"), Path("b.gguf"), "q4_0", threads=8)
    assert argv[1:] == ["a.gguf", "b.gguf", "Q4_0", "8"]
    with pytest.raises(ValueError, match="quantize makes"):
        quantize_argv(tree, Path("a.gguf"), Path("b.gguf"), "q3_xyz")


def test_missing_source_and_binaries_say_what_to_do(tmp_path):
    empty = LlamaCppTree(tmp_path / "nowhere", tmp_path / "nobuild")
    with pytest.raises(LlamaCppError, match=r"no llama\.cpp source tree at"):
        convert_argv(empty, Path("c"), "f16", Path("o"), pre_tokenizer=None)
    with pytest.raises(LlamaCppError, match=r"llama-bench is not built: no executable"):
        bench_argv(empty, Path("m.gguf"), BenchSettings())
    with pytest.raises(LlamaCppError, match="llama-speculative-simple is not built"):
        speculative_argv(empty, Path("t"), Path("d"), Path("p"), SpeculativeSettings())


def test_bad_counts_are_refused(tree):
    with pytest.raises(ValueError, match="prompt_tokens must be >= 1"):
        bench_argv(tree, Path("m"), BenchSettings(prompt_tokens=0))
    with pytest.raises(ValueError, match="n_cpu_moe must be >= 0"):
        bench_argv(tree, Path("m"), BenchSettings(n_cpu_moe=-1))
    with pytest.raises(ValueError, match="draft_max must be >= 1"):
        speculative_argv(tree, Path("t"), Path("d"), Path("p"), SpeculativeSettings(draft_max=0))


def test_run_logged_keeps_the_output_and_names_a_failure(tmp_path, tree):
    import sys

    out, seconds = run_logged(
        [sys.executable, "-c", "import sys; print('json'); print('log', file=sys.stderr)"],
        tmp_path / "a.log",
        echo=False,
        stdout_apart=True,
    )
    assert out == "json\n"
    assert seconds >= 0
    assert "log" in (tmp_path / "a.log").read_text()
    with pytest.raises(LlamaCppError, match=r"(?s)failed \(exit status 3\).*boom"):
        run_logged(
            [sys.executable, "-c", "print('boom'); raise SystemExit(3)"],
            tmp_path / "b.log",
            echo=False,
        )
    assert "LD_LIBRARY_PATH" in tree.env()
    assert tree.env()["LD_LIBRARY_PATH"].startswith(str((tree.build / "bin").resolve()))
