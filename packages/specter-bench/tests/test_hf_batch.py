"""transformers' batched generate: each row's greedy tokens, left padding, timing fields."""

import pytest
import torch

from specter_bench.hf_baseline import HFRunner
from specter_bench.hf_batch import HFBatchRunner, left_padded
from specter_models import build_reference_model


@pytest.fixture(scope="module")
def reference():
    return build_reference_model("tiny-qwen2-moe", seed=5, device="cpu", dtype=torch.float64)


def test_left_padding_right_aligns_each_prompt():
    ids, mask = left_padded([[5, 6, 7], [8]], pad_token_id=0, device="cpu")
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    with pytest.raises(ValueError, match="no prompts"):
        left_padded([], 0, "cpu")
    with pytest.raises(ValueError, match="empty"):
        left_padded([[1], []], 0, "cpu")


@pytest.mark.parametrize("system", ["hf", "hf-default"])
def test_each_row_decodes_what_it_decodes_alone(reference, system):
    g = torch.Generator().manual_seed(3)
    vocab = reference.config.vocab_size
    prompts = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (7, 4, 9)]
    single = HFRunner(reference, system, max_cache_len=64)
    alone = [single.generate(p, 6).tokens for p in prompts]
    run = HFBatchRunner(HFRunner(reference, system, max_cache_len=64), batch_sizes=2).generate(
        prompts, 6
    )
    assert run.tokens == alone
    assert run.batch_size == 3
    assert run.decode_tokens == 3 * 5  # every row's tokens after its first
    assert all(t is not None and t >= 0 for t in run.tpot_s)
    assert run.prefill_s > 0
    assert run.throughput is None or run.throughput > 0
    assert run.settings["padding"] == "left"
    assert run.peak_gpu_bytes is None  # CPU


def test_bad_arguments(reference):
    runner = HFBatchRunner(HFRunner(reference, "hf-default"))
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1"):
        runner.generate([[1, 2]], 0)


def test_batched_mm_gathers_only_what_fits_and_the_rest_goes_through_grouped_mm(monkeypatch):
    # A prompt of several sequences would gather one expert copy per routed pair (53 GB a
    # layer for DeepSeek-V2-Lite at B = 32): above the cap it goes through grouped_mm.
    from transformers.integrations import moe

    from specter_bench import hf_batch

    model = build_reference_model("tiny-qwen2-moe", seed=5, device="cpu", dtype=torch.float32)
    experts = next(m for m in model.modules() if hasattr(m, "gate_up_proj"))
    per_copy = (experts.gate_up_proj[0].numel() + experts.down_proj[0].numel()) * 4
    k = model.config.num_experts_per_tok
    monkeypatch.setattr(hf_batch, "BATCHED_MM_MAX_GATHER_BYTES", 2 * k * per_copy)
    calls = []
    for name in ("batched_mm_experts_forward", "grouped_mm_experts_forward"):
        real = getattr(moe, name)

        def spy(module, hidden, ids, weights, _real=real, _name=name):
            calls.append((_name.split("_mm")[0], hidden.shape[0]))
            return _real(module, hidden, ids, weights)

        monkeypatch.setattr(moe, name, spy)
    prompts = [[4, 9, 2, 7, 11], [5, 6, 8, 3, 12]]
    single = HFRunner(model, "hf-default", compile=False)
    alone = [single.generate(p, 3).tokens for p in prompts]
    calls.clear()
    runner = HFBatchRunner(
        HFRunner(model, "hf", compile=False, decode_experts="batched_mm_prompt_too")
    )
    assert runner.settings["experts_implementation"] == hf_batch.BATCHED_MM_CAPPED
    run = runner.generate(prompts, 3)
    assert run.tokens == alone
    layers = model.config.num_hidden_layers
    assert calls[:layers] == [("grouped", 10)] * layers  # two 5-token prompts: over the cap
    assert calls[layers:] == [("batched", 2)] * (2 * layers)  # two decode steps of B = 2
