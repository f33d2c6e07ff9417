"""A pruned draft: the draft skips some experts (no INT4 copy, no contribution), the target
still computes them, and the memory that frees buys slots; choosing which to prune."""

from __future__ import annotations

import re

import pytest
import torch

from model_helpers import (
    draft_experts_in_float64,
    moe_layer_count,
    random_prompt,
    reference_from_checkpoint,
    reference_with_draft_experts,
    speculate_beside_transformers,
)
from specter_models import (
    MemoryBudgetError,
    auto_pruned_per_layer,
    choose_hot_experts,
    coldest_experts,
    get_preset,
    hottest_experts,
    plan_memory,
    routing_counts,
)
from specter_models.experts_runtime import ExpertsMode
from specter_models.int4_draft import int4_expert_bytes
from specter_models.loader import load_model

HOT = (1, 6)  # pinned in every layer of the tiny models (8 experts each)
PRUNED = (0, 3)  # skipped by the draft in every layer


def _pruned_load(folder, dtype: torch.dtype, slots: int, hot: bool = True):
    """The tiny checkpoint on the CPU, ``PRUNED`` skipped (and ``HOT`` pinned) everywhere."""
    n = moe_layer_count(folder)
    return load_model(
        folder, device="cpu", dtype=dtype, slots_per_layer=slots,
        hot_experts=[list(HOT)] * n if hot else None, draft_pruned_experts=[list(PRUNED)] * n,
    )  # fmt: skip


@pytest.mark.parametrize("hot", [True, False], ids=["hot", "no-hot"])
def test_the_pruned_draft_is_the_target_without_its_pruned_experts(checkpoints, arch_name, hot):
    # transformers' model with the pruned experts' down projections zeroed (they add
    # nothing), the others dequantized from their INT4 copies and the hot ones exact computes
    # the draft's logits.
    folder = checkpoints[arch_name]
    lm = _pruned_load(folder, torch.float64, 4, hot=hot)
    reference = reference_with_draft_experts(lm, folder)
    exact = reference_from_checkpoint(folder)
    skipped = set(PRUNED) | (set(HOT) if hot else set())
    cold = [e for e in range(8) if e not in skipped]
    for module in lm.experts:
        assert module.pruned_experts == PRUNED
        assert module.draft_gate_up.num_experts == len(cold)  # no INT4 copy of pruned ones
    with torch.no_grad():
        ids = random_prompt(8, lm.config.vocab_size, seed=11)
        expected = reference(ids).logits
        target = exact(ids).logits
    got = lm.draft.forward(ids, 0)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)
    # The target is untouched: its logits are the checkpoint's own.
    torch.testing.assert_close(lm.target.forward(ids, 0), target, rtol=0, atol=1e-10)
    assert lm.draft_pruned_experts == [list(PRUNED)] * len(lm.experts)


@pytest.mark.parametrize("depth", [1, 4])
def test_greedy_speculation_with_a_pruned_draft_equals_transformers_generate(
    checkpoints, arch_name, depth
):
    folder = checkpoints[arch_name]
    lm = _pruned_load(folder, torch.float64, 4)
    prompt = random_prompt(6, lm.config.vocab_size, seed=depth + 3)
    result, expected = speculate_beside_transformers(lm, folder, prompt, depth, 20)
    assert result.tokens == expected
    assert result.stats.proposed > 0


@pytest.mark.parametrize("pruned", [True, False], ids=["hot-and-pruned", "hot"])
def test_fp16_hot_and_pruned_drafts_run_the_kernels_like_float64_experts(
    checkpoints, arch_name, pruned
):
    # float16 runs the skip-pairs INT4 kernel and the grouped FP16 kernel over the hot slots
    # (their torch references on the CPU): a token routed to a pruned, a hot and cold
    # experts, against float64 sums that leave the pruned pairs out.
    folder = checkpoints[arch_name]
    n = moe_layer_count(folder)
    lm = load_model(
        folder, device="cpu", dtype=torch.float16, slots_per_layer=4,
        hot_experts=[list(HOT)] * n, draft_pruned_experts=[list(PRUNED)] * n if pruned else None,
    )  # fmt: skip
    module = lm.experts[0]
    H, k = module.hidden_dim, lm.config.num_experts_per_tok
    x = torch.randn(5, H).half()
    ids = torch.stack([torch.randperm(8)[:k] for _ in range(5)])
    ids[0] = torch.tensor([PRUNED[0], HOT[0], 2, 4, 5, 7][:k])  # pruned, hot, cold pairs
    weights = torch.rand(5, k)
    with lm.runtime.running(ExpertsMode.DRAFT):
        got = module(x, ids, weights).double()
    expected = draft_experts_in_float64(lm, x, ids, weights)
    assert (got - expected).norm() < 5e-3 * expected.norm()


def test_pruning_frees_int4_memory_and_the_plan_counts_it(checkpoints):
    folder = checkpoints["tiny-qwen2-moe"]
    plain = load_model(folder, device="cpu", dtype=torch.float32, slots_per_layer=4)
    lm = _pruned_load(folder, torch.float32, 4)
    plan = lm.memory.plan
    assert (plan.hot_experts_per_layer, plan.pruned_experts_per_layer) == (2, 2)
    assert plan.draft_int4_bytes == plain.memory.plan.draft_int4_bytes * 4 // 8
    int4 = [t for name, t in lm.state_tensors("draft").items() if name.startswith("int4:")]
    assert sum(t.numel() * t.element_size() for t in int4) == plan.draft_int4_bytes
    assert "pruned=2" in repr(lm)
    assert re.search(r"experts the draft skips \(pruned, per layer\) +2\n", plan.describe())
    assert "INT4 draft experts (4/8 per layer)" in plan.describe()


def test_a_budget_buys_more_slots_with_a_pruned_draft():
    # DeepSeek-V2-Lite at 24 GB with 36 pinned: pruning 14 more experts' INT4 copies buys
    # about 14 / 4 more slots per layer.
    config = get_preset("deepseek-v2-lite").make_config()
    hot = plan_memory(config, 24, hot_experts_per_layer=36)
    pruned = plan_memory(config, 24, hot_experts_per_layer=36, pruned_experts_per_layer=14)
    assert pruned.draft_int4_bytes == 26 * (64 - 36 - 14) * int4_expert_bytes(2048, 1408)
    freed = hot.draft_int4_bytes - pruned.draft_int4_bytes
    assert pruned.slots_per_layer - hot.slots_per_layer == pytest.approx(
        freed / (26 * hot.expert_bytes), abs=1
    )
    assert pruned.slots_per_layer >= hot.slots_per_layer + 3
    assert pruned.expected_peak_bytes <= pruned.budget_bytes
    with pytest.raises(ValueError, match=r"pruned_experts_per_layer must be an int in \[0, 28\)"):
        plan_memory(config, 24, hot_experts_per_layer=36, pruned_experts_per_layer=28)
    with pytest.raises(ValueError, match=r"pruned_experts_per_layer must be an int in \[0, 64\)"):
        plan_memory(config, 24, pruned_experts_per_layer=-1)
    with pytest.raises(MemoryBudgetError, match="more pruned draft experts"):
        plan_memory(config, 4, pruned_experts_per_layer=10)


def test_bad_pruned_sets_are_refused(checkpoints):
    folder = checkpoints["tiny-qwen2-moe"]
    n = moe_layer_count(folder)
    with pytest.raises(ValueError, match=r"experts \[1\] are both hot and pruned"):
        load_model(folder, device="cpu", slots_per_layer=4, hot_experts=[[1, 6]] * n,
             draft_pruned_experts=[[1]] * n)  # fmt: skip
    with pytest.raises(ValueError, match="draft_pruned_experts needs a draft"):
        load_model(
            folder, device="cpu", slots_per_layer=4, draft=None, draft_pruned_experts=[[1]] * n
        )
    with pytest.raises(ValueError, match=f"draft_pruned_experts needs one list per MoE layer "
                       f"\\({n} in this"):  # fmt: skip
        load_model(folder, device="cpu", slots_per_layer=4, draft_pruned_experts=[[1]] * (n + 1))
    with pytest.raises(ValueError, match=r"draft_pruned_experts\[0\] must be distinct"):
        load_model(folder, device="cpu", slots_per_layer=4, draft_pruned_experts=[[2, 2]] * n)
    with pytest.raises(ValueError, match=r"pruned_experts must be distinct ids in \[0, 8\)"):
        load_model(folder, device="cpu", slots_per_layer=4, draft_pruned_experts=[[9]] * n)
    with pytest.raises(ValueError, match=r"pruned_experts_per_layer must be an int in \[0, 6\)"):
        load_model(folder, device="cpu", slots_per_layer=4, hot_experts=[[1, 6]] * n,
             draft_pruned_experts=[[0, 2, 3, 4, 5, 7]] * n)  # fmt: skip


def test_the_coldest_experts_never_meet_the_hottest():
    counts = torch.tensor([[5, 1, 1, 9, 1, 0, 3, 1], [2, 2, 2, 2, 2, 2, 2, 2]])
    assert coldest_experts(counts, 2) == [[5, 7], [6, 7]]  # ties: the higher ids
    assert hottest_experts(counts, 2) == [[0, 3], [0, 1]]  # ties: the lower ids
    for h in range(8):
        for p in range(8 - h):  # h + p < E: one expert stays INT4
            hot, cold = hottest_experts(counts, h), coldest_experts(counts, p)
            assert all(not set(a) & set(b) for a, b in zip(hot, cold, strict=True))
    with pytest.raises(ValueError, match=r"per_layer must be an int in \[0, 8\)"):
        coldest_experts(counts, 8)


def test_choose_hot_experts_plans_every_candidate_with_the_pruned_draft():
    config = get_preset("deepseek-v2-lite").make_config()
    gen = torch.Generator().manual_seed(0)
    skewed = torch.softmax(torch.randn(64, generator=gen) * 2, 0)
    routes = [
        torch.multinomial(skewed.expand(26 * 40, 64), 6, generator=gen).view(40, 26, 6)
        for _ in range(2)
    ]
    plain = choose_hot_experts(config, 24, routes, candidates=[0, 36])
    pruned = choose_hot_experts(config, 24, routes, candidates=[0, 36, 52], pruned_per_layer=14)
    assert plain.pruned_experts == []
    assert plain.pruned_per_layer == 0
    assert pruned.pruned_per_layer == 14
    assert pruned.pruned_experts == coldest_experts(routing_counts(routes, 64), 14)
    assert 52 not in pruned.loads  # 52 + 14 >= 64: no INT4 expert left
    expect = plan_memory(config, 24, hot_experts_per_layer=pruned.per_layer,
                         pruned_experts_per_layer=14).slots_per_layer  # fmt: skip
    assert pruned.slots_per_layer == expect
    if pruned.per_layer:
        hot = pruned.hot_experts
        assert all(not set(a) & set(b) for a, b in zip(hot, pruned.pruned_experts, strict=True))
    assert pruned.as_dict()["pruned_per_layer"] == 14
    # More slots at the same pins: no more loads in the replay.
    if 36 in plain.loads and 36 in pruned.loads:
        assert pruned.loads[36] <= plain.loads[36]


def test_auto_prunes_a_third_only_under_a_budget_that_leaves_experts_out():
    assert auto_pruned_per_layer(64, 39) == 21
    assert auto_pruned_per_layer(16, 5) == 5
    assert auto_pruned_per_layer(64, 64) == 0  # every expert resident: nothing to buy
    config = get_preset("deepseek-v2-lite").make_config()
    gen = torch.Generator().manual_seed(1)
    routes = [torch.randint(0, 64, (30, 26, 6), generator=gen) for _ in range(2)]
    at_24 = choose_hot_experts(config, 24, routes, candidates=[0, 36], pruned_per_layer="auto")
    assert at_24.pruned_per_layer == 21
    assert at_24.pruned_experts == coldest_experts(routing_counts(routes, 64), 21)
    unlimited = choose_hot_experts(config, None, routes, pruned_per_layer="auto")
    assert unlimited.pruned_per_layer == 0
    # 10 GB cannot hold the whole INT4 draft beside one slot a layer; the pruned one fits.
    with pytest.raises(MemoryBudgetError):
        plan_memory(config, 10)
    tight = choose_hot_experts(config, 10, routes, candidates=[0], pruned_per_layer="auto")
    assert tight.pruned_per_layer == 21
    assert tight.slots_per_layer >= 1
    with pytest.raises(ValueError, match="pruned_per_layer must be an int >= 0 or 'auto'"):
        choose_hot_experts(config, 24, routes, pruned_per_layer="all")
