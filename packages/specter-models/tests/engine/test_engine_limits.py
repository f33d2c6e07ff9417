"""Engine limits a user meets: the automatic budget, positions, broken weights, steady speed,
the depth warm-up's length."""

import pytest
import torch

from specter_models import (
    Engine,
    EngineConfig,
    KernelConfig,
    LoadConfig,
    MemoryConfig,
    SpeculationConfig,
    get_preset,
    plan_memory,
)
from specter_models.engine import auto_budget as auto_module
from specter_models.engine.auto_budget import AUTO_BUDGET_MARGIN_GB, auto_budget
from specter_models.engine.generation import NonFiniteLogitsError
from specter_models.engine.non_finite import first_non_finite_layer
from specter_models.engine.warmup import proportionate_warmup_tokens
from specter_models.kv_cache import KVCacheFullError

PROMPT = [5, 17, 42, 8, 23, 11]


def _engine(depth=2, slots=3, max_seq_len=128, **memory):
    config = EngineConfig(
        LoadConfig("tiny-deepseek-v2", device="cpu", dtype="float32", weights_seed=2),
        MemoryConfig(slots_per_layer=slots, max_seq_len=max_seq_len, **memory),
        KernelConfig(),
        SpeculationConfig(depth=depth, depth_memory=False),
    )
    return Engine.from_config(config, calibration_prompt=PROMPT)


def test_auto_budget_is_the_free_memory_less_the_margin(monkeypatch):
    config = get_preset("deepseek-v2-lite").make_config()
    fp16 = {"dtype": torch.float16, "max_seq_len": 2048}
    assert auto_budget(config, "cpu", **fp16).budget_gb is None  # no GPU memory to budget
    monkeypatch.setattr(auto_module.torch.cuda, "mem_get_info", lambda device: (20e9, 24e9))
    chosen = auto_budget(config, "cuda", **fp16)
    assert chosen.budget_gb == pytest.approx(20 - AUTO_BUDGET_MARGIN_GB)
    assert chosen.free_gb == pytest.approx(20)
    assert f"18.50 GB budget = 20.00 GB free on cuda less a {AUTO_BUDGET_MARGIN_GB} GB" in (
        chosen.reason
    )
    # Where the free memory holds every expert there is no budget at all.
    peak = plan_memory(config, None, **fp16).expected_peak_bytes
    roomy = peak + (AUTO_BUDGET_MARGIN_GB + 1) * 1e9
    monkeypatch.setattr(auto_module.torch.cuda, "mem_get_info", lambda device: (roomy, 2 * roomy))
    chosen = auto_budget(config, "cuda", **fp16)
    assert chosen.budget_gb is None
    assert "holds every expert" in chosen.reason
    monkeypatch.setattr(auto_module.torch.cuda, "mem_get_info", lambda device: (1e9, 8e9))
    with pytest.raises(ValueError, match=r"1.00 GB free, no more than the 1.5 GB margin"):
        auto_budget(config, "cuda", **fp16)


def test_memory_config_takes_auto_and_the_engine_resolves_it_on_the_cpu():
    assert MemoryConfig(gpu_memory_gb="auto").gpu_memory_gb == "auto"
    with pytest.raises(ValueError, match="'auto' or None"):
        MemoryConfig(gpu_memory_gb="lots")
    lines = []
    config = EngineConfig(
        LoadConfig("tiny-qwen2-moe", device="cpu"),
        MemoryConfig(gpu_memory_gb="auto", max_seq_len=64),
        speculation=SpeculationConfig(depth=2, depth_memory=False),
    )
    engine = Engine.from_config(config, log=lines.append)
    assert engine.budget_gb is None
    assert "auto: no GPU memory budget on the CPU" in lines


def test_a_kv_cache_longer_than_the_models_positions_is_refused():
    config = EngineConfig(
        LoadConfig("specter-code-tiny", device="cpu"),
        MemoryConfig(max_seq_len=4096),
        speculation=SpeculationConfig(depth=2, depth_memory=False),
    )
    with pytest.raises(ValueError, match=r"max_seq_len=4096: specter-code-tiny has 1024 positions"):
        Engine.from_config(config)


def test_a_kv_cache_that_fills_up_part_way_keeps_what_was_generated():
    engine = _engine()
    generation = engine.generate(PROMPT, max_new_tokens=12)

    class FillsAfterThree:  # the stream, whose KV cache fills up after three tokens
        def __init__(self, stream):
            self.stream = stream

        def __getattr__(self, name):
            return getattr(self.stream, name)

        def __iter__(self):
            for count, token in enumerate(self.stream):
                if count == 3:
                    raise KVCacheFullError("the KV cache holds at most max_seq_len positions")
                yield token

    generation._stream = FillsAfterThree(generation._stream)
    chunks = list(generation)
    assert generation.token_ids == [t for c in chunks for t in c.token_ids]
    assert len(generation.token_ids) == 3
    assert generation.stop_reason == "max_positions"
    assert generation.stats["stop_reason"] == "max_positions"


def test_non_finite_logits_stop_with_an_error_naming_the_model(monkeypatch):
    engine = _engine()
    with torch.no_grad():
        engine.model.model.model.layers[1].self_attn.o_proj.weight.fill_(float("nan"))
    for sampling in (None, "sample"):
        from specter_spec import SamplingConfig

        config = SamplingConfig(temperature=0.8, seed=1) if sampling else None
        generation = engine.generate(PROMPT, max_new_tokens=6, sampling=config)
        with pytest.raises(NonFiniteLogitsError) as caught:
            generation.result()
        message = str(caught.value)
        assert "preset:tiny-deepseek-v2" in message
        assert "check the checkpoint's files" in message
    assert first_non_finite_layer(engine.model, PROMPT) == "decoder layer 1"


def test_the_summary_separates_steady_decoding_from_the_first_iteration():
    engine = _engine()
    stats = engine.generate(PROMPT, max_new_tokens=12).result().stats
    assert stats["steady_tpot_ms"] > 0
    total_ms = stats["tpot_ms"] * stats["new_tokens"]
    later_ms = total_ms - stats["first_iteration_ms"]
    assert later_ms > 0
    # The steady figure is the later iterations' time over their tokens: below the whole
    # decode's time over the same tokens.
    assert stats["steady_tpot_ms"] < total_ms / 1


def test_the_depth_warm_up_is_in_proportion_to_the_request():
    assert proportionate_warmup_tokens(8) == 0  # short requests: none
    assert proportionate_warmup_tokens(16) == 4
    assert proportionate_warmup_tokens(64) == 16
    assert proportionate_warmup_tokens(1000) == 32
