"""The engine's CPU expert path: the configuration, its resolution at set-up, the statistics."""

from __future__ import annotations

import os

import pytest
import torch

from specter_models import (
    CpuExpertsConfig,
    CpuKernelUnavailableError,
    Engine,
    EngineConfig,
    LoadConfig,
    MemoryConfig,
    SpeculationConfig,
)
from specter_models import cpu_experts as cpu_module
from specter_models.loader import load_model
from specter_spec import SpecController

PROMPT = [5, 17, 42, 8, 23, 11]


def _engine(depth, mode, threads=1, slots=3):
    config = EngineConfig(
        load=LoadConfig("tiny-qwen2-moe", device="cpu", dtype="float64", weights_seed=2),
        memory=MemoryConfig(slots_per_layer=slots, max_seq_len=128),
        speculation=SpeculationConfig(depth=depth, depth_memory=False),
        cpu_experts=CpuExpertsConfig(mode=mode, threads=threads),
    )
    lines: list[str] = []
    return Engine.from_config(config, calibration_prompt=PROMPT, log=lines.append), lines


@pytest.fixture(scope="module")
def plain_greedy():
    lm = load_model(
        "tiny-qwen2-moe", device="cpu", dtype=torch.float64, seed=2, draft=None, max_seq_len=128
    )
    return SpecController(None, lm.target, depth=0).generate(PROMPT, 16).tokens


@pytest.mark.parametrize("depth", [3, 0])
def test_on_homes_experts_decodes_the_same_tokens_and_reports_the_split(plain_greedy, depth):
    engine, lines = _engine(depth, "on")
    setup = engine.setup_stats["cpu_placement"]
    assert setup["active"]
    assert setup["threads"] == 1
    homed = setup["placement"]["homed"]
    assert all(homed)
    assert engine.model.cpu_experts.homed == tuple(tuple(h) for h in homed)
    assert any(line.startswith("CPU experts:") for line in lines)
    generation = engine.generate(PROMPT, max_new_tokens=16, stop_token_ids=[]).result()
    assert generation.token_ids == plain_greedy  # float64: the host's sums are close enough
    split, cpu = generation.stats["placement"], generation.stats["cpu_experts"]
    assert set(split) == {"resident", "transferred", "streamed", "cpu"}
    assert split["cpu"] > 0
    assert cpu["experts_per_token"] > 0
    assert cpu["busy_ms_per_token"] > 0
    assert cpu["threads"] == 1
    assert cpu["homed_experts"] == sum(len(h) for h in homed)


def test_auto_stays_off_without_a_gpu_and_off_is_off():
    engine, lines = _engine(3, "auto")
    assert engine.model.cpu_experts is None
    assert engine.setup_stats["cpu_placement"]["reason"].startswith("no GPU to overlap")
    assert any("CPU experts off (auto)" in line for line in lines)
    off, _ = _engine(0, "off")
    assert off.model.cpu_experts is None
    generation = off.generate(PROMPT, max_new_tokens=4).result()
    assert generation.stats["placement"]["cpu"] == 0
    assert generation.stats["cpu_experts"] is None


def test_on_where_the_kernel_cannot_run_says_why(monkeypatch):
    def unsupported(*args, **kwargs):
        raise RuntimeError("not implemented for 'Double'")

    monkeypatch.setattr(cpu_module.F, "linear", unsupported)
    with pytest.raises(CpuKernelUnavailableError, match=r"cannot run here.*--cpu-experts off"):
        _engine(0, "on")


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"mode": "yes"}, r"CpuExpertsConfig.mode='yes': expected 'auto', 'off' or 'on'"),
        ({"threads": 0}, r"CpuExpertsConfig.threads=0: expected None or an int from 1"),
        ({"threads": (os.cpu_count() or 1) + 1}, r"this machine's \d+ cores"),
        ({"threads": True}, r"CpuExpertsConfig.threads=True"),
    ],
)
def test_bad_cpu_expert_settings_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CpuExpertsConfig(**kwargs)


def test_the_engine_config_takes_only_a_cpu_experts_config():
    with pytest.raises(
        ValueError, match=r"EngineConfig\.cpu_experts='on': expected a CpuExpertsConfig"
    ):
        EngineConfig(cpu_experts="on")


def _machine(device="cuda", slots=(3, 3), experts=8, graphs=False):
    from types import SimpleNamespace

    cache = SimpleNamespace(slots_per_layer=list(slots), num_experts=experts)
    return SimpleNamespace(device=torch.device(device), cache=cache, cuda_graphs=graphs)


@pytest.mark.parametrize(
    ("machine", "has_prompt", "starts"),
    [
        (_machine(device="cpu"), True, "no GPU to overlap"),
        (_machine(slots=(8, 8)), True, "every expert holds a slot"),
        (_machine(graphs=True), True, "the CPU path runs the target's experts outside CUDA"),
        (_machine(), False, "no calibration prompt"),
        (_machine(), True, None),
    ],
)
def test_auto_declines_where_the_path_cannot_pay(machine, has_prompt, starts):
    from specter_models.engine.cpu_setup import auto_declines

    why = auto_declines(machine, has_prompt=has_prompt)
    assert (why is None) if starts is None else why.startswith(starts)
