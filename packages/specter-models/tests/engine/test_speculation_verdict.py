"""The adaptive depth's verdict on speculation: read from its costs, kept per setup, and an
engine of that setup decoding plainly, without the draft, where the draft did not pay."""

import dataclasses

import pytest
import torch

from specter_models import (
    BatchConfig,
    Engine,
    EngineConfig,
    KernelConfig,
    LoadConfig,
    MemoryConfig,
    SpeculationConfig,
)
from specter_models.engine.depth_memory import CACHE_ENV_VAR
from specter_models.engine.speculation_verdict import (
    SpeculationVerdict,
    read_verdict,
    speculation_verdict,
    verdict_path,
    verdict_setup,
    write_verdict,
)
from specter_models.loader import load_model
from specter_spec import AdaptiveDepth, AdaptiveDepthConfig, FixedDepth, SpecController

PROMPT = [5, 17, 42, 8, 23, 11]
MAX_DEPTH = 4


def _policy(draft_per_token_s: float, verify_s: dict[int, float]) -> AdaptiveDepth:
    """A fresh adaptive depth primed with a cost table (acceptance: its 0.5 prior)."""
    policy = AdaptiveDepth(AdaptiveDepthConfig(max_depth=MAX_DEPTH))
    policy.prime(
        {
            "draft": {str(k): k * draft_per_token_s for k in range(1, MAX_DEPTH + 1)},
            "verify": {str(n): s for n, s in verify_s.items()},
            "overhead": {"plain": 0.0, "speculative": 0.0},
            "steady_plain": None,
        }
    )
    return policy


LOSING = {"draft_per_token_s": 5e-3, "verify_s": {n: 1e-3 * n for n in range(1, 6)}}
"""A draft step costs five plain steps and each verified row one more: K = 0 wins."""
PAYING = {"draft_per_token_s": 1e-4, "verify_s": dict.fromkeys(range(1, 6), 1e-3)}
"""Cheap draft steps, verification as dear for five rows as for one: speculating wins."""


def test_the_verdict_follows_the_cost_table():
    losing = speculation_verdict(_policy(**LOSING))
    assert losing is not None
    assert losing.pays is False
    assert losing.plain_tokens_per_s == pytest.approx(1000.0)
    assert losing.best_tokens_per_s < losing.plain_tokens_per_s
    assert losing.acceptance == pytest.approx(0.5)
    assert losing.state.startswith("off (depth auto chose 0: plain decoding 1000.0 tokens/s")
    assert losing.describe() == "speculation: " + losing.state
    paying = speculation_verdict(_policy(**PAYING))
    assert paying is not None
    assert paying.pays is True
    assert paying.best_tokens_per_s > paying.plain_tokens_per_s
    assert paying.state.startswith("on (depth auto: ")
    # No verdict without an adaptive depth, or before its costs are known.
    assert speculation_verdict(FixedDepth(3)) is None
    assert speculation_verdict(AdaptiveDepth()) is None


def _config(**speculation) -> EngineConfig:
    return EngineConfig(
        LoadConfig("tiny-deepseek-v2", device="cpu", dtype="float64", weights_seed=2),
        MemoryConfig(slots_per_layer=3, max_seq_len=128),
        KernelConfig(),
        SpeculationConfig(depth="auto", max_depth=MAX_DEPTH, **speculation),
    )


def _setup(config: EngineConfig) -> dict:
    return verdict_setup(config, device="cpu", dtype=torch.float64, budget_gb=None, max_seq_len=128)


def test_verdicts_are_kept_for_their_setup_only(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(CACHE_ENV_VAR, str(tmp_path))
    setup = _setup(_config())
    assert verdict_path(setup).parent == tmp_path / "speculation"
    assert read_verdict(setup) is None
    verdict = speculation_verdict(_policy(**LOSING))
    write_verdict(setup, verdict)
    assert read_verdict(setup) == verdict
    other = dict(setup, slots_per_layer=4)
    verdict_path(other).parent.mkdir(parents=True, exist_ok=True)
    verdict_path(other).write_text(verdict_path(setup).read_text())
    assert read_verdict(other) is None  # written for another setup: not trusted
    assert "written for another setup or schema" in capsys.readouterr().err
    # A batch's KV slots take memory a budget's expert slots would have had: its own setup.
    batched = _setup(dataclasses.replace(_config(), batch=BatchConfig(max_batch=4)))
    assert batched == dict(setup, max_batch=4)
    assert verdict_path(batched) != verdict_path(setup)


@pytest.fixture(scope="module")
def plain_greedy():
    lm = load_model(
        "tiny-deepseek-v2", device="cpu", dtype=torch.float64, seed=2, draft=None, max_seq_len=128
    )
    return SpecController(None, lm.target, depth=0).generate(PROMPT, 16).tokens


def test_a_kept_losing_verdict_makes_the_engine_decode_plainly_and_say_so(
    tmp_path, monkeypatch, plain_greedy
):
    monkeypatch.setenv(CACHE_ENV_VAR, str(tmp_path))
    config = _config()
    verdict = speculation_verdict(_policy(**LOSING))
    write_verdict(_setup(config), verdict)
    lines: list[str] = []
    engine = Engine.from_config(config, calibration_prompt=PROMPT, log=lines.append)
    assert engine.depth == 0
    assert engine.model.draft is None  # the draft's memory buys slots
    assert engine.setup_stats["speculation"] == verdict.state
    assert any(line.startswith("speculation: off (depth auto chose 0") for line in lines)
    generation = engine.generate(PROMPT, max_new_tokens=16, stop_token_ids=[])
    assert generation.result().token_ids == plain_greedy
    assert generation.stats["speculation"].startswith("off (depth auto chose 0: ")
    assert generation.stats["mean_depth"] == 0
    # keep_draft speculates whatever was kept.
    kept = Engine.from_config(_config(keep_draft=True), calibration_prompt=PROMPT)
    assert kept.depth == "auto"
    assert kept.model.draft is not None
    assert kept.setup_stats["speculation"] == "on (depth auto)"


def test_a_speculating_engine_keeps_its_verdict(tmp_path, monkeypatch, plain_greedy):
    monkeypatch.setenv(CACHE_ENV_VAR, str(tmp_path))
    config = _config()
    engine = Engine.from_config(config, calibration_prompt=PROMPT)
    assert engine.setup_stats["speculation"] == "on (depth auto)"
    assert engine.generate(PROMPT, max_new_tokens=16, stop_token_ids=[]).result().token_ids == (
        plain_greedy
    )
    kept = read_verdict(_setup(config))
    assert isinstance(kept, SpeculationVerdict)
    assert kept.best_depth >= 1
