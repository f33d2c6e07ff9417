"""Repeated runs on one load, and specter falling back to offload where its adaptive depth
chooses K = 0 (tiny models on the CPU)."""

import json
from pathlib import Path

import pytest
import torch

from specter_bench.bench_runner import BenchRunner
from specter_bench.experiments import BenchConfig
from specter_bench.prompt_sources import PromptSourceConfig

NEW_TOKENS = 5


def _prompts(tmp: Path, limit: int = 2) -> PromptSourceConfig:
    path = tmp / "prompts.jsonl"
    rows = [
        {"id": "a", "text": "def add(a, b):\n    return"},
        {"id": "b", "text": "import os\nfor name in os.listdir('.'):\n"},
        {"id": "c", "text": "class Stack:\n    def push(self, item):\n"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return PromptSourceConfig("jsonl", str(path), field="text", limit=limit)


def _run(tmp: Path, **kw):
    config = BenchConfig(
        model="tiny-qwen2-moe", experiment="tpot", max_new_tokens=NEW_TOKENS,
        max_prompt_tokens=32, device="cpu", dtype=torch.float64, seed=2, out_dir=tmp,
        tag="t", warmup_tokens=4, calibration_prompts=1, **kw,
    )  # fmt: skip
    return BenchRunner(config, progress=False, log=lambda line: None).run()


def test_runs_repeat_every_measured_pass_on_the_same_load(tmp_path):
    result = _run(
        tmp_path, prompts=_prompts(tmp_path), systems=("offload", "lru"), budgets=(None,),
        runs=3,
    )  # fmt: skip
    tpot = [r for r in result.records if r["kind"] == "tpot"]
    for system in ("offload", "lru"):
        mine = [r for r in tpot if r["system"] == system]
        assert sorted((r["run_index"], r["prompt_id"]) for r in mine) == [
            (i, p) for i in range(3) for p in ("a", "b")
        ]
        for prompt in ("a", "b"):
            tokens = [r["extra"]["tokens"] for r in mine if r["prompt_id"] == prompt]
            assert tokens[0] == tokens[1] == tokens[2]  # greedy: every run decodes the same
        for r in mine:
            assert r["ttft_ms"] > 0
            assert r["prefill_ms"] < r["ttft_ms"]
            assert r["driver_peak_gpu_memory_gb"] is None  # no driver on a CPU
            assert r["prompt_source"] == "jsonl"
            assert r["identity"]["runs"] == 3
    (memory,) = [r for r in result.records if r["kind"] == "memory"]  # one load for all runs
    data = memory["data"]
    assert data["systems"] == ["offload", "lru"]
    assert 0 < data["process_to_loaded_s"] <= data["process_to_first_token_s"]
    assert data["first_load_in_process"] in (True, False)
    assert data["driver_peak_gb"] is None
    assert data["driver_before_load_gb"] is None
    assert data["host_peak_rss_gb"] > 0
    assert data["host_pinned_gb"] >= 0


def test_specter_falls_back_to_offload_where_its_depth_chose_zero(tmp_path, monkeypatch):
    # A verdict that the draft does not pay, as an adaptive depth whose costs price plain
    # decoding above every depth would reach: specter's decodes move to offload's draftless
    # load, decode what lru decodes, and say why.
    from specter_models.engine import speculation_verdict as verdicts

    losing = verdicts.SpeculationVerdict(False, 0.4, 100.0, 2, 60.0)
    monkeypatch.setattr(verdicts, "speculation_verdict", lambda policy: losing)
    low = _budget()
    result = _run(
        tmp_path, prompts=_prompts(tmp_path, limit=1), systems=("specter", "lru"),
        budgets=(low,),
    )  # fmt: skip
    tpot = {r["system"]: r for r in result.records if r["kind"] == "tpot"}
    assert set(tpot) == {"specter", "lru"}
    specter, lru = tpot["specter"], tpot["lru"]
    settings = specter["extra"]["settings"]
    assert settings["speculation"] == losing.state
    assert settings["speculation"].startswith("off (depth auto chose 0: plain decoding 100.0")
    assert settings["draft"] is None
    assert settings["miss_path"] == "stream"
    assert specter["depth"] == 0
    assert specter["extra"]["tokens"] == lru["extra"]["tokens"]
    assert specter["slots_per_layer"] == lru["slots_per_layer"]  # the draft's memory as slots
    loads = [r["data"]["systems"] for r in result.records if r["kind"] == "memory"]
    assert ["specter"] in loads  # the fallback load, beside specter's own and lru's


@pytest.mark.parametrize(("specter_ms", "falls_back"), [(9.0, True), (4.0, False)])
def test_specter_falls_back_where_offload_decoded_its_trial_faster(
    tmp_path, monkeypatch, specter_ms, falls_back
):
    # offload is measured first at the budget; after specter's warm-up, both arms' trial
    # decode of the first prompt decides: slower than offload, specter decodes as offload.
    trials = []

    def trial(self, runner):
        trials.append(runner.system.name)
        return {"offload": 5.0, "specter": specter_ms}[runner.system.name]

    monkeypatch.setattr(BenchRunner, "_trial_ms", trial)
    result = _run(
        tmp_path, prompts=_prompts(tmp_path, limit=1), systems=("specter", "offload"),
        budgets=(_budget(),),
    )  # fmt: skip
    assert trials == ["offload", "specter"]
    tpot = {r["system"]: r for r in result.records if r["kind"] == "tpot"}
    assert set(tpot) == {"specter", "offload"}
    settings = tpot["specter"]["extra"]["settings"]
    loads = [r["data"]["systems"] for r in result.records if r["kind"] == "memory"]
    if falls_back:
        assert settings["speculation"] == (
            "off (depth auto measured plain decoding faster: 5.00 ms a token against 9.00 "
            "with the draft on the first prompt)"
        )
        assert settings["draft"] is None
        assert tpot["specter"]["extra"]["tokens"] == tpot["offload"]["extra"]["tokens"]
        assert loads == [["offload"], ["specter"], ["specter"]]  # the fallback load last
    else:
        assert settings["speculation"] == "on (depth auto)"
        assert settings["draft"] == "int4"
        assert loads == [["offload"], ["specter"]]  # no fallback load


@pytest.mark.parametrize("setting", [{"depth": 2}, {"fallback": False}])
def test_a_fixed_depth_or_no_fallback_keeps_speculating(tmp_path, monkeypatch, setting):
    from specter_models.engine import speculation_verdict as verdicts

    losing = verdicts.SpeculationVerdict(False, 0.4, 100.0, 2, 60.0)
    monkeypatch.setattr(verdicts, "speculation_verdict", lambda policy: losing)
    result = _run(
        tmp_path, prompts=_prompts(tmp_path, limit=1), systems=("specter",), budgets=(_budget(),),
        **setting,
    )  # fmt: skip
    (specter,) = [r for r in result.records if r["kind"] == "tpot"]
    depth = setting.get("depth", "auto")
    assert specter["extra"]["settings"]["speculation"] == f"on (depth {depth})"
    assert specter["extra"]["settings"]["draft"] == "int4"
    assert len([r for r in result.records if r["kind"] == "memory"]) == 1


def _budget() -> float:
    """A budget that leaves tiny-qwen2-moe's draftless load 4 of its 8 slots a layer."""
    import specter_models

    config = specter_models.preset_config("tiny-qwen2-moe")
    plan = specter_models.plan_memory(
        config, slots_per_layer=4, with_draft=False, dtype=torch.float64, max_seq_len=64
    )
    return round((plan.expected_peak_bytes + plan.num_moe_layers * plan.expert_bytes // 2) / 1e9, 6)
