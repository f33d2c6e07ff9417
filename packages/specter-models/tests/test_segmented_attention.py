"""Segmented attention: a plan must cover the forward's rows in order; without one the
attention modules run as they are."""

from __future__ import annotations

import pytest
import torch

from model_helpers import tiny_transformers_model
from specter_models.kv_cache import StaticKVCache
from specter_models.segmented_attention import AttentionSegment, install_segmented_attention


def _segment(begin: int, end: int) -> AttentionSegment:
    cache = StaticKVCache([((1, 1), (1, 1))], 4, torch.float32, "cpu")
    return AttentionSegment(begin, end, cache, torch.ones(1, 1, end - begin, 4, dtype=torch.bool))


def test_a_plan_covers_the_rows_in_order():
    model = tiny_transformers_model("tiny-qwen2-moe", seed=1)
    holder = install_segmented_attention(model)
    assert install_segmented_attention(model) is holder  # installed once
    assert holder.modules == model.config.num_hidden_layers
    with pytest.raises(ValueError, match="at least one segment"), holder.segments([]):
        pass
    with (
        pytest.raises(ValueError, match=r"cover rows 0\.\.N-1 in order"),
        holder.segments([_segment(0, 2), _segment(3, 4)]),
    ):
        pass
    with holder.segments([_segment(0, 2), _segment(2, 3)]):
        assert holder.plan is not None
    assert holder.plan is None


def test_without_a_plan_the_model_computes_what_it_did():
    model = tiny_transformers_model("tiny-phimoe", seed=2)
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.no_grad():
        before = model(ids).logits
        install_segmented_attention(model)
        after = model(ids).logits
    assert torch.equal(before, after)
