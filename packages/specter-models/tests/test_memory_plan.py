"""The GPU memory plan: fixed state, INT4 draft, KV, buffers and slots from a budget."""

from __future__ import annotations

import pytest
import torch

from specter_models import MemoryBudgetError, get_preset, plan_memory
from specter_models.int4_draft import int4_expert_bytes


def test_deepseek_v2_lite_at_its_low_budget():
    config = get_preset("deepseek-v2-lite").make_config()
    plan = plan_memory(config, 16)
    assert plan.non_expert_bytes == 1_311_632_896 * 2
    assert plan.draft_int4_bytes == 26 * 64 * int4_expert_bytes(2048, 1408)
    assert plan.expert_bytes == 3 * 2048 * 1408 * 2
    assert plan.kv_cache_bytes == 27 * 2048 * (512 + 64) * 2
    assert config.num_experts_per_tok < plan.slots_per_layer < 64
    assert plan.expected_peak_bytes <= plan.budget_bytes
    assert plan.budget_bytes - plan.expected_peak_bytes < 26 * plan.expert_bytes  # no slot left out
    text = plan.describe()
    for row in ("non-expert weights", "INT4 draft experts", "KV cache", "expected peak"):
        assert row in text
    assert plan.as_dict()["expected_peak_bytes"] == plan.expected_peak_bytes
    plain = plan_memory(config, 16, with_draft=False)
    assert plain.draft_int4_bytes == 0
    assert plain.slots_per_layer > plan.slots_per_layer  # the draft's memory, as slots
    assert "INT4 draft experts" in plain.describe()
    assert "none (no draft: plain decoding)" in plain.describe()
    assert "none (no draft" not in text


@pytest.mark.parametrize(("name", "budget"), [("qwen1.5-moe", 14), ("phi-3.5-moe", 32)])
def test_low_budgets_of_the_other_models_fit(name, budget):
    config = get_preset(name).make_config()
    plan = plan_memory(config, budget)
    assert 1 <= plan.slots_per_layer < plan.num_experts
    bigger = plan_memory(config, budget + 8)
    assert bigger.slots_per_layer > plan.slots_per_layer


def test_too_small_budget_names_what_fills_it():
    config = get_preset("phi-3.5-moe").make_config()
    with pytest.raises(MemoryBudgetError, match=r"needs at least 2[0-9]\.[0-9]+ GB") as info:
        plan_memory(config, 16)
    assert "INT4 draft experts" in str(info.value)
    assert isinstance(info.value, ValueError)
    # Without the draft the same model fits.
    assert plan_memory(config, 16, with_draft=False).slots_per_layer >= 1


def test_slot_count_instead_of_budget_and_no_budget():
    config = get_preset("tiny-qwen2-moe").make_config()
    assert plan_memory(config, slots_per_layer=3).slots_per_layer == 3
    assert plan_memory(config).slots_per_layer == 8
    assert plan_memory(config).budget_bytes is None
    with pytest.raises(ValueError, match=r"\[1, 8\]"):
        plan_memory(config, slots_per_layer=9)
    with pytest.raises(ValueError, match="not both"):
        plan_memory(config, 1.0, slots_per_layer=2)


def test_kv_and_dtype_scale_the_plan():
    config = get_preset("tiny-phimoe").make_config()
    a = plan_memory(config, dtype=torch.float16, max_seq_len=100)
    b = plan_memory(config, dtype=torch.float32, max_seq_len=200)
    assert b.kv_cache_bytes == 4 * a.kv_cache_bytes
    assert b.non_expert_bytes == 2 * a.non_expert_bytes
    assert b.draft_int4_bytes == a.draft_int4_bytes  # INT4 does not depend on the dtype


def test_a_staging_buffer_is_fixed_state():
    config = get_preset("deepseek-v2-lite").make_config()
    plain = plan_memory(config, 24)
    staged = plan_memory(config, 24, staging_slots=8)
    assert staged.staging_bytes == 8 * plain.expert_bytes
    assert staged.fixed_bytes == plain.fixed_bytes + staged.staging_bytes
    assert staged.expected_peak_bytes <= staged.budget_bytes
    slot_row = 26 * plain.expert_bytes  # one slot in every layer
    spare = plain.budget_bytes - plain.expected_peak_bytes
    assert staged.slots_per_layer == plain.slots_per_layer - (staged.staging_bytes > spare)
    assert staged.slots_per_layer >= plain.slots_per_layer - 1  # 138 MB < one slot per layer
    assert staged.staging_bytes < slot_row
    assert "staging buffer (8 FP16 experts)" in staged.describe()
    assert "staging buffer" not in plain.describe()
    assert staged.as_dict()["staging_bytes"] == staged.staging_bytes
    with pytest.raises(ValueError, match=r"staging_slots must be an int >= 0.*-1"):
        plan_memory(config, 24, staging_slots=-1)
    tiny = get_preset("tiny-qwen2-moe").make_config()
    base = plan_memory(tiny, slots_per_layer=2)
    need = base.fixed_bytes + base.num_moe_layers * base.expert_bytes
    with pytest.raises(MemoryBudgetError, match="a staging buffer"):
        plan_memory(tiny, need / 1e9, staging_slots=base.num_moe_layers + 1)


def test_describe_names_a_fixed_slot_count_and_the_host_stores_dtype():
    config = get_preset("tiny-qwen2-moe").make_config()
    fixed = plan_memory(config, slots_per_layer=2).describe()
    assert "every expert resident" not in fixed
    assert "none (2 expert slots per layer, fixed)" in fixed
    assert "every expert resident" in plan_memory(config).describe()
    wide = plan_memory(config, slots_per_layer=2, dtype=torch.float32).describe()
    assert "host store (every routed expert, float32)" in wide
    assert "pinned" not in wide.split("host store")[1].split("\n")[0]


def test_a_batch_of_sequences_holds_a_kv_slot_each():
    config = get_preset("deepseek-v2-lite").make_config()
    one = plan_memory(config, 24, max_seq_len=8192)
    four = plan_memory(config, 24, max_seq_len=8192, max_batch=4)
    assert four.kv_cache_bytes == 4 * one.kv_cache_bytes
    assert four.buffer_bytes > one.buffer_bytes  # logits and MLP rows of four sequences
    assert four.slots_per_layer < one.slots_per_layer  # the budget pays for them
    assert four.max_batch == 4
    assert "KV cache (4 sequences x 8192 positions)" in four.describe()
    with pytest.raises(ValueError, match="max_batch must be an int >= 1"):
        plan_memory(config, 24, max_batch=0)
