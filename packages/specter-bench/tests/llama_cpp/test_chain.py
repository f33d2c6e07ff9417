"""chain: checkpoint, conversion, deletion, quantization and measurement in order, each step
skipped once its output exists."""

import pytest

from llama_cpp_fakes import calls, make_build, make_source
from specter_bench.bench_record import read_records
from specter_bench.llama_cpp.chain import ChainConfig, gguf_path, run_chain
from specter_bench.llama_cpp.invocations import LlamaCppError, LlamaCppTree
from specter_bench.llama_cpp.measure import MeasureConfig
from specter_bench.prompt_sources import PromptSourceConfig


@pytest.fixture
def tree(tmp_path):
    return LlamaCppTree(make_source(tmp_path / "src"), make_build(tmp_path / "build"))


def _config(tmp_path, **changes):
    measure = MeasureConfig(
        gguf=tmp_path,  # set per type by the chain
        budgets=(None, 24.0),
        prompt_tokens=512,  # the fake llama-bench prints a -p 512 -n 128 run
        repetitions=3,
        prompts=PromptSourceConfig(limit=1),
        out_dir=tmp_path / "results",
        tag="t",
    )
    settings = {
        "model": "tiny-qwen2-moe",
        "work": tmp_path / "models",
        "types": ("f16", "q8_0"),
        "draft_type": "q4_0",
        "measure": measure,
    }
    return ChainConfig(**(settings | changes))


def test_the_whole_chain_in_order(tree, tmp_path):
    lines = []
    records = run_chain(tree, _config(tmp_path), say=lines.append)
    work = tmp_path / "models"
    for weights in ("f16", "q8_0", "q4_0"):
        assert gguf_path(work, "tiny-qwen2-moe", weights).is_file()
    assert not (work / "tiny-qwen2-moe").exists()  # the checkpoint, deleted once converted
    names = [c.split()[0].rsplit("/", 1)[-1] for c in calls(tree.build)]
    assert names == [
        "llama-quantize",
        "llama-quantize",
        "llama-bench",  # f16: unlimited, 24 GB
        "llama-bench",
        "llama-bench",  # q8_0
        "llama-bench",
        "llama-speculative-simple",  # f16 + q4_0 draft: 1 prompt x 3 repetitions
        "llama-speculative-simple",
        "llama-speculative-simple",
        "llama-speculative-simple",  # and at 24 GB
        "llama-speculative-simple",
        "llama-speculative-simple",
    ]
    systems = {r["system"] for r in records}
    assert systems == {
        "llama.cpp-gpu-f16",
        "llama.cpp-cpu-moe-f16",
        "llama.cpp-gpu-q8_0",  # 16.7 GB of Q8_0 fits 24 GB whole: no expert on the CPU
        "llama.cpp-spec-gpu-f16-q4_0",
        "llama.cpp-spec-cpu-moe-f16-q4_0",
    }
    assert {r["model"] for r in records} == {"tiny-qwen2-moe"}
    on_disk = read_records(tmp_path / "results" / "bench-tiny-qwen2-moe-t.jsonl")
    assert len(on_disk) == len(records) == 4 * 3 + 6
    assert any(line.startswith("step times: checkpoint") for line in lines)


def test_a_second_run_skips_what_is_done(tree, tmp_path):
    run_chain(tree, _config(tmp_path, steps=("checkpoint", "convert")), say=lambda _: None)
    assert gguf_path(tmp_path / "models", "tiny-qwen2-moe", "f16").is_file()
    assert calls(tree.build) == []
    run_chain(tree, _config(tmp_path, steps=("checkpoint", "convert", "quantize")), say=print)
    assert len(calls(tree.build)) == 2  # only the two quantizations ran


def test_the_checkpoint_can_stay_and_a_foreign_folder_is_not_touched(tree, tmp_path):
    run_chain(
        tree,
        _config(tmp_path, steps=("checkpoint", "convert"), keep_checkpoint=True),
        say=lambda _: None,
    )
    assert (tmp_path / "models" / "tiny-qwen2-moe" / "config.json").is_file()
    foreign = tmp_path / "elsewhere"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    config = _config(tmp_path / "second", checkpoint=foreign, steps=("checkpoint",))
    with pytest.raises(LlamaCppError, match="is in the way"):
        run_chain(tree, config, say=lambda _: None)
    assert (foreign / "notes.txt").is_file()


def test_bad_steps_and_types(tree, tmp_path):
    with pytest.raises(ValueError, match="unknown steps"):
        run_chain(tree, _config(tmp_path, steps=("bake",)))
    with pytest.raises(ValueError, match="types must include f16"):
        run_chain(tree, _config(tmp_path, types=("q8_0",)))
