"""results: llama-bench's JSON and llama-speculative-simple's report as tpot records."""

import json
from pathlib import Path

import pytest

from llama_cpp_fakes import DATA, SPECULATIVE_REPORT
from specter_bench.bench_record import append_records, read_records
from specter_bench.llama_cpp.invocations import BenchSettings
from specter_bench.llama_cpp.results import (
    bench_records,
    parse_bench_json,
    parse_speculative_output,
    speculative_record,
    system_name,
)
from specter_bench.tpot_tables import summarize_tpot

SAMPLE = (DATA / "llama_bench_cpu_moe.json").read_text()
SETTINGS = BenchSettings(prompt_tokens=512, new_tokens=128, repetitions=3, n_cpu_moe=8)


def test_parse_finds_the_four_tests_after_any_log_text():
    tests = parse_bench_json("ggml_cuda_init: found 1 CUDA devices\n" + SAMPLE)
    assert [(t["n_prompt"], t["n_gen"], t["n_depth"]) for t in tests] == [
        (512, 0, 0),
        (0, 128, 0),
        (512, 0, 512),
        (0, 128, 512),
    ]


def test_one_record_per_repetition_from_the_decode_at_depth(tmp_path):
    records = bench_records(
        parse_bench_json(SAMPLE),
        SETTINGS,
        system="llama.cpp-cpu-moe-f16",
        model="deepseek-v2-lite",
        budget_gb=24.0,
        identity={"git_commit": "abc", "started_at": "2026-12-08T10:00:00+00:00"},
        driver_peak_gb=23.4,
        extra={"gguf": "x.gguf"},
    )
    assert [r["run_index"] for r in records] == [0, 1, 2]
    # tg 128 @ d512 took 3.072, 3.050 and 3.110 s: TPOT = time / 128.
    assert [r["tpot_ms"] for r in records] == pytest.approx([24.0, 23.828125, 24.296875])
    assert [r["prefill_ms"] for r in records] == pytest.approx([412.0, 405.0, 409.0])
    assert [r["ttft_ms"] for r in records] == [r["prefill_ms"] for r in records]
    first = records[0]
    assert first["kind"] == "tpot"
    assert first["tokens_per_s"] == pytest.approx(1000 / 24.0)
    assert first["decode_ms"] == pytest.approx(3072.0)
    assert first["driver_peak_gpu_memory_gb"] == 23.4
    assert first["extra"]["tpot_ms_at_depth_0"] == pytest.approx(2944 / 128)
    assert first["extra"]["settings"]["n_cpu_moe"] == 8
    assert first["extra"]["settings"]["build_commit"] == "82bb485"
    assert first["extra"]["gguf"] == "x.gguf"
    # The records are Specter's: they read back, and the TPOT table summarises them.
    path = tmp_path / "r.jsonl"
    append_records(path, records)
    (summary,) = summarize_tpot(read_records(path))
    assert summary.system == "llama.cpp-cpu-moe-f16"
    assert summary.budget_gb == 24.0
    assert summary.tpot_ms == pytest.approx(24.0)


def test_bench_output_without_the_decode_is_refused():
    tests = [t for t in parse_bench_json(SAMPLE) if t["n_gen"] == 0]
    with pytest.raises(ValueError, match=r"no 'tg 128 @ d512' test"):
        bench_records(tests, SETTINGS, system="s", model="m", budget_gb=None, identity={})
    with pytest.raises(ValueError, match="not a JSON array of tests"):
        parse_bench_json("| model | size |\n| --- | --- |")
    with pytest.raises(ValueError, match="lacks"):
        parse_bench_json(json.dumps([{"n_prompt": 1}]))


def test_speculative_report_becomes_a_record():
    result = parse_speculative_output(SPECULATIVE_REPORT.format(prompt="def f():", encoded=42))
    assert result.prompt_tokens == 42
    assert result.new_tokens == 130
    assert result.decode_s == pytest.approx(1.3)
    assert result.acceptance == pytest.approx(90 / 160)
    record = speculative_record(
        result,
        system="llama.cpp-spec-gpu-f16-q4_0",
        model="deepseek-v2-lite",
        budget_gb=None,
        prompt_source="humaneval",
        prompt_id="HumanEval/0",
        run_index=2,
        identity={},
    )
    assert record["tpot_ms"] == pytest.approx(10.0)
    assert record["acceptance_rate"] == pytest.approx(0.5625)
    assert record["accepted_per_iteration"] == pytest.approx(90 / 40)  # 40 drafts of 4
    assert record["depth"] == 4.0
    assert record["prefill_ms"] == pytest.approx(91.0)
    assert record["run_index"] == 2


def test_an_unfinished_speculative_run_is_refused():
    with pytest.raises(ValueError, match="no 'decoded' line"):
        parse_speculative_output("encoded   10 tokens in 0.1 seconds\n")


def test_system_names_say_placement_weights_and_draft():
    assert system_name("f16", 0) == "llama.cpp-gpu-f16"
    assert system_name("q8_0", 8) == "llama.cpp-cpu-moe-q8_0"
    assert system_name("f16", 0, "q4_0") == "llama.cpp-spec-gpu-f16-q4_0"
    assert system_name("f16", 12, "q8_0") == "llama.cpp-spec-cpu-moe-f16-q8_0"


def test_sample_follows_llama_bench_field_order():
    # The sample is llama-bench's own layout: its fields in order, then the samples.
    first = json.loads(SAMPLE)[0]
    keys = list(first)
    assert keys[:5] == ["build_commit", "build_number", "cpu_info", "gpu_info", "backends"]
    assert keys[-6:] == ["avg_ns", "stddev_ns", "avg_ts", "stddev_ts", "samples_ns", "samples_ts"]
    assert Path(DATA / "llama_bench_cpu_moe.json").is_file()
