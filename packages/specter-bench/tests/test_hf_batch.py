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
