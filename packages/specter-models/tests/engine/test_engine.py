"""Engine: greedy output is the target's own, chunks stream the text, cancel stops, bad
configurations fail clearly."""

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
from specter_models.loader import load_model
from specter_spec import SamplingConfig, SpecController

PROMPT = [5, 17, 42, 8, 23, 11]


def _engine(depth, slots=3, **speculation):
    config = EngineConfig(
        LoadConfig("tiny-deepseek-v2", device="cpu", dtype="float64", weights_seed=2),
        MemoryConfig(slots_per_layer=slots, max_seq_len=128),
        KernelConfig(),
        SpeculationConfig(depth=depth, depth_memory=False, **speculation),
    )
    return Engine.from_config(config, calibration_prompt=PROMPT)


@pytest.fixture(scope="module")
def plain_greedy():
    lm = load_model(
        "tiny-deepseek-v2", device="cpu", dtype=torch.float64, seed=2, draft=None, max_seq_len=128
    )
    return SpecController(None, lm.target, depth=0).generate(PROMPT, 20).tokens


@pytest.mark.parametrize(("depth", "slots"), [(3, 3), ("auto", 3), ("auto", 8), (0, 2)])
def test_greedy_generation_is_target_only_greedy_decoding(plain_greedy, depth, slots):
    engine = _engine(depth, slots)
    generation = engine.generate(PROMPT, max_new_tokens=20, stop_token_ids=[])
    chunks = list(generation)
    assert generation.token_ids == plain_greedy
    assert [t for chunk in chunks for t in chunk.token_ids] == plain_greedy
    assert generation.stop_reason == "max_new_tokens"
    assert generation.stats["new_tokens"] == 20
    assert generation.stats["slots_per_layer"] == slots
    # A second generation on the same engine starts afresh and decodes the same tokens.
    again = engine.generate(PROMPT, max_new_tokens=20, stop_token_ids=[]).result()
    assert again.token_ids == plain_greedy


def test_streamed_chunks_concatenate_to_the_final_text():
    engine = _engine(3)
    text = "def f(x):\n    return x"
    generation = engine.generate(text, max_new_tokens=16, stop_token_ids=[])
    chunks = list(generation)
    assert generation.text == engine.tokenizer.decode(generation.token_ids)
    assert "".join(chunk.text for chunk in chunks) == generation.text
    assert len(generation.token_ids) == 16
    assert generation.stats["acceptance_rate"] is not None
    assert generation.stats["device"] == "cpu"


def test_cancel_stops_at_the_next_step(plain_greedy):
    engine = _engine(3)
    generation = engine.generate(PROMPT, max_new_tokens=20, stop_token_ids=[])
    seen = []
    for chunk in generation:
        seen.extend(chunk.token_ids)
        if len(seen) == 4:
            generation.cancel()
    assert seen == generation.token_ids == plain_greedy[:4]
    assert generation.stop_reason == "cancelled"
    assert generation.stats is not None
    # The engine goes on: the next generation is whole.
    assert engine.generate(PROMPT, max_new_tokens=20, stop_token_ids=[]).result().token_ids == (
        plain_greedy
    )


def test_sampling_reaches_the_controller():
    engine = _engine(2)
    sampling = SamplingConfig(temperature=0.9, top_k=20, seed=3)
    first = engine.generate(PROMPT, max_new_tokens=8, sampling=sampling).result()
    second = engine.generate(PROMPT, max_new_tokens=8, sampling=sampling).result()
    assert first.token_ids == second.token_ids
    assert len(first.token_ids) <= 8


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: MemoryConfig(slots_per_layer=0),
            "MemoryConfig.slots_per_layer=0: expected an int >= 1",
        ),
        (lambda: MemoryConfig(gpu_memory_gb=-2.0), "MemoryConfig.gpu_memory_gb=-2.0: expected"),
        (
            lambda: MemoryConfig(gpu_memory_gb=8.0, slots_per_layer=4),
            "gpu_memory_gb=8.0 and slots_per_layer=4 are exclusive",
        ),
        (lambda: MemoryConfig(miss_path="copy"), "MemoryConfig.miss_path='copy': expected"),
        (lambda: LoadConfig(device="tpu"), "LoadConfig.device='tpu': expected"),
        (lambda: LoadConfig(dtype="float8"), "LoadConfig.dtype='float8': expected"),
        (lambda: KernelConfig(cuda_graphs="yes"), "KernelConfig.cuda_graphs='yes': expected"),
        (lambda: SpeculationConfig(depth=-1), "SpeculationConfig.depth=-1: expected an int >= 0"),
        (lambda: SpeculationConfig(depth=0, keep_draft=True), "depth=0 decodes plainly"),
        (
            lambda: EngineConfig(
                memory=MemoryConfig(hot_experts="auto"), speculation=SpeculationConfig(depth=0)
            ),
            "decodes without a draft",
        ),
        (lambda: EngineConfig(load="tiny-deepseek-v2"), "EngineConfig.load='tiny-deepseek-v2'"),
    ],
)
def test_a_bad_configuration_fails_clearly(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_engine_errors_name_what_to_change():
    with pytest.raises(TypeError, match=r"Engine\.from_config"):
        Engine()
    config = EngineConfig(
        LoadConfig("tiny-deepseek-v2", device="cpu"),
        MemoryConfig(gpu_memory_gb=1.0, hot_experts="auto"),
    )
    with pytest.raises(ValueError, match="pass calibration_prompt"):
        Engine.from_config(config)
    engine = _engine(3)
    with pytest.raises(ValueError, match="KV cache holds 128"):
        engine.generate(PROMPT, max_new_tokens=200)
    with pytest.raises(ValueError, match="max_new_tokens must be an int >= 1, got 0"):
        engine.generate(PROMPT, max_new_tokens=0)
    with pytest.raises(ValueError, match="the prompt is empty"):
        engine.generate("", max_new_tokens=4)
