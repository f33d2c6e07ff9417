"""The benchmark's CPU expert variants on a tiny model (CPU, float64): every engine system
with the path off and on, one shared placement per budget, its record and table."""

import json
from pathlib import Path

import pytest
import torch

from specter_bench.bench_cpu import cpu_table
from specter_bench.bench_runner import BenchRunner
from specter_bench.experiments import BenchConfig
from specter_bench.prompt_sources import PromptSourceConfig


def _config(tmp: Path, **changes) -> BenchConfig:
    path = tmp / "prompts.jsonl"
    rows = [
        {"id": "a", "text": "def add(a, b):\n    return"},
        {"id": "b", "text": "class Stack:\n    def push(self, item):\n"},
        {"id": "c", "text": "while True:\n    line = input()\n"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return BenchConfig(
        model="tiny-qwen2-moe",
        experiment="tpot",
        systems=("lru", "specter"),
        prompts=PromptSourceConfig("jsonl", str(path), field="text", limit=1),
        max_new_tokens=8,
        max_prompt_tokens=40,
        depth=2,
        device="cpu",
        dtype=torch.float64,
        seed=2,
        out_dir=tmp / "results",
        tag="cpu",
        warmup=0,
        calibration_prompts=2,
        **changes,
    )


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench-cpu")
    low = BenchRunner(_config(tmp), progress=False, log=lambda line: None).budgets[0]
    config = _config(tmp, budgets=(low,), cpu_experts=("off", "on", "auto"), cpu_threads=(1,))
    lines: list[str] = []
    runner = BenchRunner(config, progress=False, log=lines.append)
    return runner, runner.run(), lines


def test_each_engine_system_runs_with_the_path_off_and_on(cpu_run):
    _, result, lines = cpu_run
    tpot = [r for r in result.records if r["kind"] == "tpot"]
    names = {r["system"] for r in tpot}
    assert names == {"lru", "specter", "lru+cpu-on1", "specter+cpu-on1"}
    for record in tpot:
        settings = record["extra"]["settings"]
        split = settings["placement"]
        if "+cpu" in record["system"]:
            assert settings["cpu_experts"]["threads"] == 1
            assert split["cpu"] > 0
        else:
            assert settings["cpu_experts"] is None
            assert split["cpu"] == 0
        # float64: the host's sums and the plain-torch path's pick the same tokens.
        assert record["matches_engine_reference"] in (True, None)
        # Systems with CPU experts are checked against the first one with the same placement.
        reference = record["engine_reference_system"]
        if reference is not None:
            assert ("+cpu" in reference) == ("+cpu" in record["system"])
    assert any("+cpu" in r["system"] and r["engine_reference_system"] is not None for r in tpot)
    # auto stays off on a CPU device: recorded as not measured, with why.
    assert any("no GPU to overlap" in line for line in result.skipped)
    assert any(line.startswith("CPU experts (on, 1 threads):") for line in lines)


def test_one_placement_per_budget_is_recorded_with_the_host(cpu_run):
    runner, result, _ = cpu_run
    placements = [r for r in result.records if r["kind"] == "cpu_placement"]
    assert len(placements) == 1  # shared by lru and specter at the budget
    data = placements[0]["data"]
    assert data["mode"] == "on"
    assert data["threads"] == 1
    assert all(data["homed_per_layer"])
    assert data["calibration_prompts"] == 2
    hot = runner.hot_choices[placements[0]["budget_gb"]]
    for layer, homed in enumerate(data["homed"]):
        assert not set(homed) & set(hot.hot_experts[layer] if hot.per_layer else ())
    assert data["host"]["cpu"]
    assert data["host"]["memory_gb_per_s"] > 0
    assert placements[0]["identity"]["host_cpu"] == data["host"]["cpu"]


def test_the_table_lists_the_split_and_host_time(cpu_run):
    _, result, _ = cpu_run
    table = cpu_table([r for r in result.records if r["kind"] == "tpot"])
    assert table is not None
    assert "| specter+cpu-on1 |" in table
    assert "| lru+cpu-on1 |" in table
    assert "| specter |" not in table
    assert cpu_table([]) is None


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"cpu_experts": ()}, "cpu_experts must name some of auto, off and on"),
        ({"cpu_experts": ("sometimes",)}, "cpu_experts must name some of"),
        ({"cpu_threads": (0,)}, "cpu_threads must be thread counts from 1"),
    ],
)
def test_bad_cpu_settings_are_refused(tmp_path, changes, match):
    with pytest.raises(ValueError, match=match):
        _config(tmp_path, **changes)
