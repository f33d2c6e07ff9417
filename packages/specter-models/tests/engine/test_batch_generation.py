"""Engine.generate_batch: every prompt's greedy output is what Engine.generate decodes for it
alone (any depth, different prompt lengths, sequences finishing early), seeded sampling draws
the same tokens, the working set is the union of the sequences', bad input fails clearly."""

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
from specter_spec import SamplingConfig

PROMPTS = [
    [5, 17, 42, 8, 23, 11],
    [3],
    [9, 9, 1, 4, 6, 7, 8, 1, 2, 30, 31, 44, 2],
    [60, 61],
    [12, 13, 14, 15],
]
BUDGETS = [20, 6, 15, 18, 11]  # the second finishes early


def _engine(depth, model="tiny-qwen2-moe", max_batch=5, slots=3):
    config = EngineConfig(
        LoadConfig(model, device="cpu", dtype="float64", weights_seed=2),
        MemoryConfig(slots_per_layer=slots, max_seq_len=128),
        KernelConfig(),
        SpeculationConfig(depth=depth, depth_memory=False),
        batch=BatchConfig(max_batch=max_batch),
    )
    return Engine.from_config(config, calibration_prompt=PROMPTS[0])


def _alone(engine, prompts, budgets, **kwargs):
    return [
        engine.generate(p, max_new_tokens=n, **kwargs).result().token_ids
        for p, n in zip(prompts, budgets, strict=True)
    ]


@pytest.fixture(scope="module", params=[3, "auto", 0], ids=["depth3", "auto", "plain"])
def engine(request):
    built = _engine(request.param)
    built.expected = _alone(built, PROMPTS, BUDGETS, stop_token_ids=[])
    return built


@pytest.mark.parametrize("batch", [2, 3, 5])
def test_greedy_batch_equals_each_prompt_decoded_alone(engine, batch):
    generation = engine.generate_batch(
        PROMPTS[:batch], max_new_tokens=BUDGETS[:batch], stop_token_ids=[]
    )
    chunks = list(generation)
    for index, result in enumerate(generation.results):
        assert result.token_ids == engine.expected[index], (engine.depth, batch, index)
        assert result.stop_reason == "max_new_tokens"
        assert [t for c in chunks if c.index == index for t in c.token_ids] == result.token_ids
        assert "".join(c.text for c in chunks if c.index == index) == result.text
        assert [c.finish_reason for c in chunks if c.index == index and c.finished] == [
            "max_new_tokens"
        ]
    stats = generation.stats
    assert stats["tokens_out"] == sum(BUDGETS[:batch])
    assert stats["sequences"] == batch
    assert 1 < stats["mean_active_batch"] <= batch  # the short one left early
    assert len(stats["acceptance"]) == batch
    assert len(stats["working_set_target_per_layer"]) == engine.model.cache.num_layers
    speculated = engine.depth != 0
    assert (stats["working_set_draft_per_layer"] is not None) == speculated
    if engine.depth == 3 and batch > 2:  # proposals were rejected: slots rolled back alone
        assert min(stats["acceptance"]) < 1


def test_a_stop_token_ends_a_sequence_as_it_ends_alone(engine):
    stop = engine.expected[0][4]
    expected = _alone(engine, PROMPTS[:3], BUDGETS[:3], stop_token_ids=[stop])
    generation = engine.generate_batch(
        PROMPTS[:3], max_new_tokens=BUDGETS[:3], stop_token_ids=[stop]
    ).result()
    assert [r.token_ids for r in generation.results] == expected
    assert generation.results[0].stop_reason == "stop_token"
    assert generation.results[0].token_ids[-1] == stop


@pytest.mark.parametrize("depth", [3, 0])
def test_seeded_sampling_draws_what_each_prompt_draws_alone(depth):
    engine = _engine(depth, max_batch=3)
    samplings = [
        SamplingConfig(temperature=1.0, seed=11),
        SamplingConfig(temperature=0.8, top_k=20, seed=12),
        None,  # greedy beside sampled ones
    ]
    expected = [
        engine.generate(p, max_new_tokens=n, sampling=s, stop_token_ids=[]).result().token_ids
        for p, n, s in zip(PROMPTS[:3], BUDGETS[:3], samplings, strict=True)
    ]
    generation = engine.generate_batch(
        PROMPTS[:3], max_new_tokens=BUDGETS[:3], sampling=samplings, stop_token_ids=[]
    ).result()
    assert [r.token_ids for r in generation.results] == expected


@pytest.mark.parametrize("model", ["tiny-deepseek-v2", "tiny-phimoe"])
def test_the_other_architectures_batch_exactly(model):
    engine = _engine(3, model=model, max_batch=3)
    expected = _alone(engine, PROMPTS[:3], BUDGETS[:3], stop_token_ids=[])
    generation = engine.generate_batch(
        PROMPTS[:3], max_new_tokens=BUDGETS[:3], stop_token_ids=[]
    ).result()
    assert [r.token_ids for r in generation.results] == expected


def test_a_batch_needs_at_least_each_sequences_experts_per_layer():
    engine = _engine(3, max_batch=3)
    budgets = [12, 12, 12]  # equal budgets: every step runs all three
    alone = []
    for prompt in PROMPTS[:3]:
        one = engine.generate_batch([prompt], max_new_tokens=12, stop_token_ids=[]).result()
        alone.append(one.stats["working_set_target_per_layer"])
    together = engine.generate_batch(
        PROMPTS[:3], max_new_tokens=budgets, stop_token_ids=[]
    ).result()
    union = together.stats["working_set_target_per_layer"]
    assert together.stats["mean_active_batch"] == 3
    for layer, experts in enumerate(union):
        assert experts >= max(single[layer] for single in alone)
    assert sum(union) > max(sum(single) for single in alone)


def test_bad_batches_fail_clearly():
    engine = _engine(2, max_batch=2)
    with pytest.raises(ValueError, match="prompts is empty"):
        engine.generate_batch([], max_new_tokens=4)
    with pytest.raises(TypeError, match="prompts must be a list of prompts"):
        engine.generate_batch("def f(x):", max_new_tokens=4)
    with pytest.raises(ValueError, match="3 prompts but the engine decodes at most 2"):
        engine.generate_batch(PROMPTS[:3], max_new_tokens=4)
    with pytest.raises(ValueError, match="max_new_tokens has 3 entries for 2 prompts"):
        engine.generate_batch(PROMPTS[:2], max_new_tokens=[4, 4, 4])
    with pytest.raises(ValueError, match="sampling has 1 entries for 2 prompts"):
        engine.generate_batch(PROMPTS[:2], max_new_tokens=4, sampling=[SamplingConfig()])
    with pytest.raises(TypeError, match="sampling must be a SamplingConfig"):
        engine.generate_batch(PROMPTS[:2], max_new_tokens=4, sampling="greedy")
    with pytest.raises(ValueError, match="the prompt has no tokens"):
        engine.generate_batch([[1], []], max_new_tokens=4)
    with pytest.raises(ValueError, match="KV cache holds 128"):
        engine.generate_batch(PROMPTS[:2], max_new_tokens=[4, 200])
    with pytest.raises(ValueError, match=r"BatchConfig\.max_batch=0: expected an int >= 1"):
        BatchConfig(max_batch=0)
    generation = engine.generate_batch(PROMPTS[:2], max_new_tokens=4)
    with pytest.raises(IndexError, match="before the generation started"):
        generation.cancel(0)
    generation.result()
    with pytest.raises(RuntimeError, match="can be iterated once"):
        list(generation)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("depth", [3, "auto", 0])
@pytest.mark.parametrize("slots", [2, None])
@pytest.mark.parametrize("model", ["tiny-deepseek-v2", "tiny-qwen2-moe", "tiny-phimoe"])
def test_cuda_greedy_batch_equals_each_prompt_alone(model, slots, depth):
    """fp16 with batch-invariant kernels and CUDA graphs (the defaults): bit-exact, so token
    for token, with prompts whose KV windows differ (300 tokens: 512 keys beside 256)."""
    config = EngineConfig(
        LoadConfig(model, device="cuda", weights_seed=4),
        MemoryConfig(slots_per_layer=slots, max_seq_len=384),
        KernelConfig(),
        SpeculationConfig(depth=depth, depth_memory=False),
        batch=BatchConfig(max_batch=4),
    )
    engine = Engine.from_config(config, calibration_prompt=PROMPTS[0])
    prompts = [*PROMPTS[:3], [(7 * i) % 90 + 1 for i in range(300)]]
    budgets = [24, 6, 24, 20]
    expected = _alone(engine, prompts, budgets, stop_token_ids=[])
    generation = engine.generate_batch(prompts, max_new_tokens=budgets, stop_token_ids=[])
    result = generation.result()
    assert [r.token_ids for r in result.results] == expected
    graphs = result.stats["graphs"]  # the packed forwards were captured and replayed
    assert graphs["disabled_reason"] is None
    if depth != 0 or slots is None:  # a draft or an all-resident target: no host decision
        assert graphs["captures"] >= 1, graphs
        assert graphs["replays"] >= 1, graphs


def test_the_batch_statistics_say_whether_it_speculated():
    from specter_models.engine.batch_session import speculation_said

    assert speculation_said(False, [0, 0]) == "off (plain decoding)"
    assert speculation_said(True, [0, 0, 0]) == "off (K = 0 at every step)"
    assert speculation_said(True, [3, 0, 2, 0]) == "on (K = 0 at 2 of 4 steps)"
    assert speculation_said(True, [3, 3]) == "on"
    # What the batch did wins over the engine's setup statistics of the same name.
    plain = _engine(0, max_batch=2)
    stats = plain.generate_batch(PROMPTS[:2], max_new_tokens=4, stop_token_ids=[]).result().stats
    assert stats["speculation"] == "off (plain decoding)"
    assert stats["graphs"] is None  # no CUDA graphs on the CPU
    fixed = _engine(3, max_batch=2)
    stats = fixed.generate_batch(PROMPTS[:2], max_new_tokens=6, stop_token_ids=[]).result().stats
    assert stats["speculation"].startswith("on")
