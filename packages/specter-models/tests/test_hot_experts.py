"""A pinned hot set: the draft computes pinned experts from their FP16 slots, holds INT4
copies of the others only, and the memory that frees buys slots; choosing the set."""

from __future__ import annotations

import pytest
import torch

from model_helpers import (
    moe_layer_count,
    random_prompt,
    reference_from_checkpoint,
    reference_with_draft_experts,
    speculate_beside_transformers,
)
from specter_cache import simulate_policy
from specter_cache.trace_simulation import windowed_trace
from specter_models import (
    MemoryBudgetError,
    choose_hot_experts,
    get_preset,
    hottest_experts,
    plan_memory,
    replay_plain_decoding,
    routing_counts,
)
from specter_models.architecture import find_moe_layers
from specter_models.int4_draft import int4_expert_bytes
from specter_models.loader import load_model

HOT = (1, 6)  # pinned in every layer of the tiny models (8 experts each)


def _hot(lm_or_layers: int) -> list[list[int]]:
    return [list(HOT) for _ in range(lm_or_layers)]


def _hot_load(folder, dtype: torch.dtype, slots: int):
    """The tiny checkpoint on the CPU with ``HOT`` pinned in every MoE layer."""
    return load_model(
        folder, device="cpu", dtype=dtype, slots_per_layer=slots,
        hot_experts=_hot(moe_layer_count(folder)),
    )  # fmt: skip


def test_hot_draft_is_the_target_with_only_the_cold_experts_dequantized(checkpoints, arch_name):
    # transformers' model with the cold experts replaced by their dequantized INT4 copies and
    # the hot ones left exact computes the draft's logits: hot experts come from FP16 slots.
    folder = checkpoints[arch_name]
    lm = _hot_load(folder, torch.float64, 4)
    reference = reference_with_draft_experts(lm, folder)
    exact = reference_from_checkpoint(folder)
    cold = [e for e in range(8) if e not in HOT]
    layers = find_moe_layers(lm.model)
    for module in lm.experts:
        assert module.hot_experts == HOT
        assert module.draft_gate_up.num_experts == len(cold)  # no INT4 copy of hot ones
        decoder = layers[module.layer].decoder_layer
        d = reference.model.layers[decoder].mlp.experts
        ex = exact.model.layers[decoder].mlp.experts
        for e in HOT:  # the hot experts stay the checkpoint's own
            assert torch.equal(d.gate_up_proj[e], ex.gate_up_proj[e])
    with torch.no_grad():
        ids = random_prompt(8, lm.config.vocab_size, seed=5)
        expected = reference(ids).logits
        plain = exact(ids).logits
    got = lm.draft.forward(ids, 0)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)
    assert not torch.allclose(got, plain)  # the cold experts are INT4: not the target


@pytest.mark.parametrize("depth", [1, 4])
def test_greedy_speculation_with_a_hot_set_equals_transformers_generate(
    checkpoints, arch_name, depth
):
    folder = checkpoints[arch_name]
    lm = _hot_load(folder, torch.float64, 3)
    prompt = random_prompt(6, lm.config.vocab_size, seed=depth + 7)
    result, expected = speculate_beside_transformers(lm, folder, prompt, depth, 20)
    assert result.tokens == expected
    assert lm.cache.stats()["total"]["misses"] > 0  # one evictable slot per layer: loads
    assert lm.hot_experts == _hot(lm.cache.num_layers)  # the pins survived every eviction
    for layer in range(lm.cache.num_layers):
        assert all(lm.cache.slot_of(layer, e) >= 0 for e in HOT)


def test_the_hot_set_frees_int4_memory_and_the_plan_counts_it(checkpoints):
    folder = checkpoints["tiny-qwen2-moe"]
    plain = load_model(folder, device="cpu", dtype=torch.float32, slots_per_layer=4)
    lm = _hot_load(folder, torch.float32, 4)
    plan = lm.memory.plan
    assert plan.hot_experts_per_layer == 2
    assert plan.draft_int4_bytes == plain.memory.plan.draft_int4_bytes * 6 // 8
    int4 = [t for name, t in lm.state_tensors("draft").items() if name.startswith("int4:")]
    assert sum(t.numel() * t.element_size() for t in int4) == plan.draft_int4_bytes
    assert "hot_experts=2" in repr(lm)
    assert "pinned hot experts" in plan.describe()


def test_a_budget_buys_more_slots_with_a_hot_set():
    # DeepSeek-V2-Lite at 24 GB: every pinned expert drops an INT4 copy (about a quarter of an
    # FP16 expert), so 28 pinned experts buy about seven more slots per layer.
    config = get_preset("deepseek-v2-lite").make_config()
    base = plan_memory(config, 24)
    hot = plan_memory(config, 24, hot_experts_per_layer=28)
    assert hot.draft_int4_bytes == 26 * (64 - 28) * int4_expert_bytes(2048, 1408)
    freed = base.draft_int4_bytes - hot.draft_int4_bytes
    assert hot.slots_per_layer - base.slots_per_layer == pytest.approx(
        freed / (26 * base.expert_bytes), abs=1
    )
    assert hot.slots_per_layer > base.slots_per_layer + 5
    assert hot.expected_peak_bytes <= hot.budget_bytes
    with pytest.raises(MemoryBudgetError, match="pinned hot experts plus one evictable"):
        plan_memory(config, 24, hot_experts_per_layer=50)
    with pytest.raises(ValueError, match=r"hot_experts_per_layer must be an int in \[0, 64\)"):
        plan_memory(config, 24, hot_experts_per_layer=64)
    with pytest.raises(ValueError, match=r"slots_per_layer must be an int in \[3, 64\]"):
        plan_memory(config, slots_per_layer=2, hot_experts_per_layer=2)


def test_bad_hot_sets_are_refused(checkpoints):
    folder = checkpoints["tiny-qwen2-moe"]
    layers = moe_layer_count(folder)
    with pytest.raises(ValueError, match=f"one list per MoE layer \\({layers} in this"):
        load_model(folder, device="cpu", slots_per_layer=4, hot_experts=[[1]] * (layers + 1))
    with pytest.raises(ValueError, match="same number of experts in every layer"):
        load_model(folder, device="cpu", slots_per_layer=4, hot_experts=[[1], [1, 2]])
    with pytest.raises(ValueError, match="distinct expert ids"):
        load_model(folder, device="cpu", slots_per_layer=4, hot_experts=[[1, 1]] * layers)
    with pytest.raises(ValueError, match=r"distinct ids in \[0, 8\)"):
        load_model(folder, device="cpu", slots_per_layer=4, hot_experts=[[9]] * layers)
    with pytest.raises(ValueError, match="one sequence of expert ids per MoE layer"):
        load_model(folder, device="cpu", slots_per_layer=4, hot_experts=[1, 2])
    with pytest.raises(ValueError, match=r"slots_per_layer must be an int in \[3, 8\]"):
        load_model(folder, device="cpu", slots_per_layer=2, hot_experts=[[1, 2]] * layers)


def test_drafting_with_unpinned_hot_experts_is_refused(checkpoints):
    folder = checkpoints["tiny-deepseek-v2"]
    lm = load_model(
        folder, device="cpu", slots_per_layer=4, hot_experts=_hot(moe_layer_count(folder))
    )
    lm.cache.unpin(0, list(HOT))
    with pytest.raises(RuntimeError, match=r"hot experts \[1, 6\] are not pinned"):
        lm.draft.forward(torch.tensor([[3, 4]]), 0)


# ------------------------------------------------------------------------- choosing the set
def test_routing_counts_and_the_hottest_experts():
    routes = [torch.tensor([[[0, 2], [1, 3]], [[2, 3], [1, 0]]]), torch.tensor([[[2, 1], [3, 1]]])]
    counts = routing_counts(routes, num_experts=4)
    assert counts.tolist() == [[1, 1, 3, 1], [1, 3, 0, 2]]
    assert hottest_experts(counts, 2) == [[0, 2], [1, 3]]  # ties go to the lower id
    assert hottest_experts(counts, 0) == [[], []]
    with pytest.raises(ValueError, match=r"per_layer must be an int in \[0, 4\)"):
        hottest_experts(counts, 4)
    with pytest.raises(ValueError, match=r"outside \[0, 4\)"):
        routing_counts([torch.tensor([[[5, 1]]])], num_experts=4)
    with pytest.raises(ValueError, match="one L"):
        routing_counts([torch.zeros(2, 2, 1, dtype=torch.long), torch.zeros(2, 3, 1).long()], 4)


def _skewed_routing(T: int, L: int, E: int, hot: list[int], seed: int) -> torch.Tensor:
    """``[T, L, 2]``: one pair of each token on ``hot`` experts, one uniform over the others."""
    g = torch.Generator().manual_seed(seed)
    hot_ids = torch.tensor(hot)[torch.randint(0, len(hot), (T, L), generator=g)]
    others = torch.tensor([e for e in range(E) if e not in hot])
    cold_ids = others[torch.randint(0, len(others), (T, L), generator=g)]
    return torch.stack([hot_ids, cold_ids], dim=-1)


def _local_routing(T: int, L: int, experts: list[int], seed: int, k: int = 6) -> torch.Tensor:
    """``[T, L, k]``: every token routed among ``experts`` only (strong locality)."""
    g = torch.Generator().manual_seed(seed)
    pool = torch.tensor(experts)
    rows = [pool[torch.randperm(len(pool), generator=g)[:k]] for _ in range(T * L)]
    return torch.stack(rows).view(T, L, k)


def test_pinning_pays_more_on_concentrated_routing_and_even_on_uniform_routing():
    # DeepSeek-V2-Lite at 24 GB. Uniform routing: a pinned slot serves its share as an LRU
    # slot would, and the INT4 copies it frees buy more slots, so pins still win; routing
    # concentrated on a few experts wins more.
    config = get_preset("deepseek-v2-lite").make_config()
    E, L = 64, 26
    hot = [3, 9, 17, 20, 33, 41, 50, 60]
    skewed = [_skewed_routing(64, L, E, hot, seed=s) for s in range(2)]
    choice = choose_hot_experts(config, 24, skewed, window=5, candidates=[0, 8, 16])
    assert choice.per_layer in (8, 16)
    assert set(choice.loads) == {0, 8, 16}
    assert all(set(hot) <= set(layer) for layer in choice.hot_experts)
    assert (
        choice.slots_per_layer
        == plan_memory(config, 24, hot_experts_per_layer=choice.per_layer).slots_per_layer
    )
    g = torch.Generator().manual_seed(0)
    uniform = [torch.randint(0, E, (64, L, 6), generator=g) for _ in range(2)]
    spread = choose_hot_experts(config, 24, uniform, window=5, candidates=[0, 8, 16])
    assert spread.per_layer > 0
    gain = choice.loads[choice.per_layer] / choice.loads[0]
    assert gain < spread.loads[spread.per_layer] / spread.loads[0] < 1
    # No budget: every expert is resident, nothing to pin.
    unlimited = choose_hot_experts(config, None, skewed)
    assert (unlimited.per_layer, unlimited.loads, unlimited.slots_per_layer) == (0, {}, 64)


def test_a_hot_set_is_scored_on_other_folds_than_it_was_counted_on():
    # Each prompt stays on 20 experts of its own, which LRU's 30 slots hold: pins counted on
    # the *other* prompt are useless and take evictable slots, so no pinning is chosen
    # (scored on the prompt it was counted on, pinning its own 20 experts would have won).
    config = get_preset("deepseek-v2-lite").make_config()
    a = _local_routing(64, 26, list(range(20)), seed=1)
    b = _local_routing(64, 26, list(range(40, 60)), seed=2)
    choice = choose_hot_experts(config, 24, [a, b], candidates=[0, 8, 16, 20])
    assert choice.per_layer == 0
    assert choice.loads[16] > choice.loads[0]
    # One routing alone is split into halves: both stay on the same experts, so the first
    # half's hot set serves the second and pinning wins.
    assert choose_hot_experts(config, 24, [a], candidates=[0, 8, 16, 20]).per_layer > 0
    with pytest.raises(ValueError, match="T >= 2"):
        choose_hot_experts(config, 24, [a[:1]])
    with pytest.raises(ValueError, match="at least one calibration routing"):
        choose_hot_experts(config, 24, [])
    with pytest.raises(MemoryBudgetError, match=r"none of the pinned counts \[50\] fits"):
        choose_hot_experts(config, 24, [a, b], candidates=[50])


def test_plain_decodings_replay_uses_the_draftless_slots_and_compares_with_the_hot_sets():
    # DeepSeek-V2-Lite at 24 GB: without the draft the budget holds more slots. Routing that
    # stays on the same 42 experts a layer fits them and not the draft's: plain decoding
    # starts warm with the other fold's experts and loads nothing, fewer than any hot set.
    # Uniform routing is replayed token by token through LRU after the warm start.
    config = get_preset("deepseek-v2-lite").make_config()
    draftless = plan_memory(config, 24, with_draft=False).slots_per_layer
    local = [_local_routing(64, 26, list(range(42)), seed=s) for s in (3, 4)]
    plain = replay_plain_decoding(config, 24, local)
    assert plain.slots_per_layer == draftless > 42
    assert plain.loads == 0
    choice = choose_hot_experts(config, 24, local, candidates=[0, 16, 32])
    assert choice.slots_per_layer < 42
    assert plain.loads < min(choice.loads.values())
    g = torch.Generator().manual_seed(5)
    uniform = torch.randint(0, 64, (40, 26, 6), generator=g)
    halves = [uniform[:20], uniform[20:]]
    expect = 0
    for i, half in enumerate(halves):
        warm = hottest_experts(routing_counts([halves[1 - i]], 64), draftless)
        trace = [
            [frozenset(w), *steps] for w, steps in zip(warm, windowed_trace(half, 1), strict=False)
        ]
        replay = simulate_policy(trace, "lru", draftless, num_experts=64)
        expect += replay.loads - draftless * 26
    got = replay_plain_decoding(config, 24, [uniform]).loads
    assert got == expect
    cold = sum(simulate_policy(windowed_trace(h, 1), "lru", draftless).loads for h in halves)
    assert 0 < got < cold
    assert replay_plain_decoding(config, 60, local).loads == 0  # every expert resident
    assert replay_plain_decoding(config, 60, local).as_dict()["slots_per_layer"] == 64
    with pytest.raises(MemoryBudgetError):
        replay_plain_decoding(config, 2, local)
    with pytest.raises(ValueError, match="at least one calibration routing"):
        replay_plain_decoding(config, 24, [])
