"""The plain-or-draft trial at load: which setups run it, the faster arm is kept (and said),
each arm decodes greedily what the target decodes alone, a released engine refuses work."""

from types import SimpleNamespace

import pytest
import torch

from specter_models import (
    Engine,
    EngineConfig,
    KernelConfig,
    LoadConfig,
    MemoryConfig,
    SpeculationConfig,
)
from specter_models.engine import arm_trial
from specter_models.loader import load_model
from specter_spec import SpecController

PROMPT = [5, 17, 42, 8, 23, 11]


def _config(depth="auto", slots=3, device="cpu", **speculation):
    return EngineConfig(
        LoadConfig("tiny-deepseek-v2", device=device, dtype="float64", weights_seed=2),
        MemoryConfig(slots_per_layer=slots, max_seq_len=128),
        KernelConfig(),
        SpeculationConfig(depth=depth, depth_memory=False, **speculation),
    )


def test_the_trial_runs_for_an_adaptive_depth_under_a_budget_with_a_prompt():
    assert arm_trial.trial_tokens_of(_config(device="cuda"), PROMPT) == 32
    assert arm_trial.trial_tokens_of(_config(), PROMPT) == 0  # CPU timings choose nothing
    assert arm_trial.trial_tokens_of(_config(trial_tokens=8), PROMPT) == 8
    assert arm_trial.trial_tokens_of(_config(device="cuda", trial_tokens=0), PROMPT) == 0
    assert arm_trial.trial_tokens_of(_config(depth=3, device="cuda"), PROMPT) == 0
    assert arm_trial.trial_tokens_of(_config(device="cuda", keep_draft=True), PROMPT) == 0
    assert arm_trial.trial_tokens_of(_config(slots=None, device="cuda"), PROMPT) == 0
    assert arm_trial.trial_tokens_of(_config(device="cuda"), None) == 0
    with pytest.raises(ValueError, match=r"SpeculationConfig\.trial_tokens=-1"):
        SpeculationConfig(trial_tokens=-1)


def test_an_arm_is_timed_on_its_second_decode():
    calls = []

    def engine(steady):
        def generate(prompt, max_new_tokens, stop_token_ids):
            calls.append((tuple(prompt), max_new_tokens, tuple(stop_token_ids)))
            stats = {"tpot_ms": 10.0 * len(calls), "steady_tpot_ms": steady and 3.0 * len(calls)}
            return SimpleNamespace(result=lambda: SimpleNamespace(stats=stats))

        return SimpleNamespace(generate=generate)

    assert arm_trial.trial_ms(engine(steady=True), PROMPT, 7) == 6.0  # after the first iteration
    assert calls == [(tuple(PROMPT), 7, ())] * 2
    calls.clear()
    assert arm_trial.trial_ms(engine(steady=None), PROMPT, 7) == 20.0  # one iteration only


@pytest.fixture(scope="module")
def target_greedy():
    lm = load_model(
        "tiny-deepseek-v2", device="cpu", dtype=torch.float64, seed=2, draft=None, max_seq_len=128
    )
    return SpecController(None, lm.target, depth=0).generate(PROMPT, 12).tokens


@pytest.mark.parametrize("faster", ["plain", "speculative"])
def test_the_faster_arm_is_kept_and_says_so(monkeypatch, target_greedy, faster):
    built = []
    real_set_up = Engine._set_up

    def counting(self, config, prompt, log):
        built.append(config.speculation.depth)
        real_set_up(self, config, prompt, log)

    times = {"plain": {0: 5.0, "auto": 9.0}, "speculative": {0: 9.0, "auto": 4.0}}[faster]

    def timed(engine, prompt, tokens):
        assert (list(prompt), tokens) == (PROMPT, 4)
        return times[engine.depth]

    monkeypatch.setattr(Engine, "_set_up", counting)
    monkeypatch.setattr(arm_trial, "trial_ms", timed)
    lines = []
    engine = Engine.from_config(
        _config(trial_tokens=4), calibration_prompt=PROMPT, log=lines.append
    )
    trial = engine.setup_stats["arm_trial"]
    if faster == "plain":
        assert built == [0, "auto", 0]  # plain, the draft, plain again (kept)
        assert engine.depth == 0
        assert engine.model.draft is None  # the draft's memory is slots
        assert engine.setup_stats["speculation"] == (
            "off (depth auto measured plain decoding faster: 5.00 ms a token against 9.00 "
            "with the draft)"
        )
        assert trial == {"tokens": 4, "plain_ms": 5.0, "speculative_ms": 9.0, "kept": "plain"}
    else:
        assert built == [0, "auto"]  # the draft's engine, measured last, is kept
        assert engine.depth == "auto"
        assert engine.model.draft is not None
        assert engine.setup_stats["speculation"] == (
            "on (depth auto measured 4.00 ms a token with the draft against 9.00 without it)"
        )
        assert trial["kept"] == "speculative"
    assert any("auto: timing plain decoding and speculation" in line for line in lines)
    generation = engine.generate(PROMPT, max_new_tokens=12, stop_token_ids=[]).result()
    assert generation.token_ids == target_greedy  # either arm: the target's own greedy tokens
    assert generation.stats["arm_trial"] == trial


def test_a_released_engine_refuses_to_decode():
    engine = Engine.from_config(_config(depth=0), calibration_prompt=PROMPT)
    engine.release()
    assert engine.model is None
    with pytest.raises(RuntimeError, match="this engine was released"):
        engine.generate(PROMPT, max_new_tokens=2)
    with pytest.raises(RuntimeError, match="this engine was released"):
        engine.batch_session()
