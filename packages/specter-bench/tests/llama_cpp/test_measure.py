"""measure: each budget's --n-cpu-moe, llama-bench and speculative runs, records on disk."""

from pathlib import Path

import pytest

from gguf_samples import Q4_0, deepseek_v2_lite_gguf
from llama_cpp_fakes import calls, make_build, make_source
from specter_bench.bench_record import read_records
from specter_bench.llama_cpp.cpu_moe import BudgetTooSmallError
from specter_bench.llama_cpp.invocations import LlamaCppTree
from specter_bench.llama_cpp.measure import MeasureConfig, measure
from specter_bench.prompt_sources import PromptSourceConfig
from specter_bench.tpot_tables import summarize_tpot


@pytest.fixture
def setup(tmp_path):
    tree = LlamaCppTree(make_source(tmp_path / "src"), make_build(tmp_path / "build"))
    target = deepseek_v2_lite_gguf(tmp_path / "deepseek-v2-lite-f16.gguf")
    draft = deepseek_v2_lite_gguf(tmp_path / "deepseek-v2-lite-q4_0.gguf", Q4_0)
    return tree, target, draft, tmp_path


def _flag(line: str, name: str) -> str:
    parts = line.split()
    return parts[parts.index(name) + 1]


def test_each_budget_gets_its_own_cpu_moe_and_records(setup):
    tree, target, _, root = setup
    config = MeasureConfig(
        gguf=target,
        budgets=(None, 24.0, 16.0),
        prompt_tokens=512,  # the sample's -p 512 -n 128
        out_dir=root / "out",
        tag="t",
        command="c",
        log_dir=root / "logs",
    )
    records = measure(tree, config, say=lambda _: None)
    runs = calls(tree.build)
    assert len(runs) == 3
    assert "--n-cpu-moe" not in runs[0]
    assert _flag(runs[1], "--n-cpu-moe") == "8"
    assert _flag(runs[2], "--n-cpu-moe") == "16"
    written = read_records(root / "out" / "bench-deepseek-v2-lite-f16-t.jsonl")
    assert written == records
    systems = [(s.system, s.budget_gb) for s in summarize_tpot(written)]
    assert systems == [
        ("llama.cpp-cpu-moe-f16", 16.0),
        ("llama.cpp-cpu-moe-f16", 24.0),
        ("llama.cpp-gpu-f16", None),
    ]
    plan = written[3]["extra"]["cpu_moe_plan"]
    assert plan["n_cpu_moe"] == 8
    assert plan["estimated_gpu_gb"] <= 24.0
    assert written[0]["identity"]["command"] == "c"
    assert written[0]["identity"]["device"] == "cuda"
    assert not (root / "out" / "logs").exists()  # logs go to log_dir, not the results
    assert len(list((root / "logs").glob("*.log"))) == 3


def test_a_fixed_count_is_used_at_every_budget(setup):
    tree, target, _, root = setup
    config = MeasureConfig(
        gguf=target,
        budgets=(24.0,),
        n_cpu_moe=27,
        prompt_tokens=512,
        out_dir=root / "o",
        log_dir=root / "l",
    )
    (record, *_) = measure(tree, config, say=lambda _: None)
    assert _flag(calls(tree.build)[0], "--n-cpu-moe") == "27"
    assert record["system"] == "llama.cpp-cpu-moe-f16"
    assert record["extra"]["cpu_moe_plan"]["moe_blocks_on_cpu"] == 26


def test_speculative_runs_each_prompt_each_repetition(setup):
    tree, target, draft, root = setup
    config = MeasureConfig(
        gguf=target,
        budgets=(None,),
        draft=draft,
        repetitions=2,
        prompts=PromptSourceConfig(limit=2),
        model_label="dsv2",
        out_dir=root / "o",
        tag="t",
        skip_plain=True,
        log_dir=root / "logs",
    )
    records = measure(tree, config, say=lambda _: None)
    runs = calls(tree.build)
    assert len(runs) == 4  # 2 prompts x 2 repetitions, no llama-bench
    assert all(Path(r.split()[0]).name == "llama-speculative-simple" for r in runs)
    assert [r["run_index"] for r in records] == [0, 0, 1, 1]
    assert {r["system"] for r in records} == {"llama.cpp-spec-gpu-f16-q4_0"}
    assert records[0]["prompt_id"] == "HumanEval/0"
    assert records[0]["acceptance_rate"] == pytest.approx(90 / 160)
    assert Path(root / "o" / "bench-dsv2-t.jsonl").is_file()


def test_a_budget_too_small_is_refused_before_running(setup):
    tree, target, _, root = setup
    config = MeasureConfig(gguf=target, budgets=(1.0,), out_dir=root, log_dir=root)
    with pytest.raises(BudgetTooSmallError, match=r"cannot hold llama\.cpp's state"):
        measure(tree, config, say=print)
    assert calls(tree.build) == []
