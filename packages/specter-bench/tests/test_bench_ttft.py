"""The ttft experiment: prompts of exact lengths, time to first token per system and length,
lengths the model cannot hold skipped (tiny models on the CPU)."""

import json

import pytest
import torch

from specter_bench.bench_runner import BenchRunner
from specter_bench.bench_ttft import ttft_prompt_ids
from specter_bench.experiments import BenchConfig
from specter_bench.prompt_sources import PromptSourceConfig
from specter_models.tokenizers import ByteTokenizer


def test_prompts_repeat_the_text_to_exactly_each_length():
    tokenizer = ByteTokenizer(vocab_size=512)
    texts = ["def f(x):\n    return x", "Every map is an argument."]
    once = tokenizer.encode("\n\n".join(texts))
    for length in (3, len(once), len(once) + 1, 700):
        ids = ttft_prompt_ids(texts, tokenizer, length)
        assert len(ids) == length
        assert ids[: min(length, len(once))] == once[:length]
    with pytest.raises(ValueError, match="have none"):
        ttft_prompt_ids(["", ""], tokenizer, 8)


def test_the_ttft_experiment_records_each_system_and_length(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text(json.dumps({"id": "a", "text": "def add(a, b):\n    return a + b\n"}) + "\n")
    config = BenchConfig(
        model="tiny-qwen2-moe", experiment="ttft", budgets=(None,), depth=2,
        prompts=PromptSourceConfig("jsonl", str(path), field="text", limit=1),
        prompt_lengths=(16, 90, 600), max_new_tokens=4, device="cpu", dtype=torch.float64,
        seed=2, out_dir=tmp_path, tag="ttft", warmup_tokens=4, calibration_prompts=0, runs=2,
    )  # fmt: skip
    runner = BenchRunner(config, progress=False, log=lambda line: None)
    assert runner.max_seq_len >= 90 + 4 + config.max_depth + 2
    result = runner.run()
    ttft = [r for r in result.records if r["kind"] == "ttft"]
    cells = sorted((r["data"]["system"], r["data"]["prompt_tokens"], r["data"]["run_index"])
                   for r in ttft)  # fmt: skip
    assert cells == sorted(
        (s, n, i) for s in ("specter", "offload", "lru") for n in (16, 90) for i in (0, 1)
    )
    for r in ttft:
        d = r["data"]
        assert 0 < d["prefill_ms"] < d["ttft_ms"]
        assert d["new_tokens"] == 4
        assert d["driver_peak_gpu_memory_gb"] is None
        assert d["matches_reference"] in (None, True)  # greedy tokens agree at each length
    assert sum(r["data"]["matches_reference"] is True for r in ttft) == 2 * 2 * 3 - 2
    # 600 tokens, 4 new ones and a verification of depth 16 exceed the 512 positions.
    (skipped,) = [r for r in result.records if r["kind"] == "skipped"]
    assert "ttft at 600 prompt tokens" in skipped["data"]["what"]
    assert "512 positions" in skipped["data"]["reason"]
    assert not [r for r in result.records if r["kind"] == "tpot"]
    (memory,) = [r for r in result.records if r["kind"] == "memory"]
    assert memory["data"]["max_seq_len"] == runner.max_seq_len
    assert 0 < memory["data"]["process_to_loaded_s"] <= memory["data"]["process_to_first_token_s"]
