"""Target verification through the expert cache: waves (resident first, missing as they
arrive), fewer slots than needed experts, expert-wise equal to token-wise, and the modes."""

from __future__ import annotations

import pytest
import torch

from model_helpers import random_prompt, reference_from_checkpoint
from specter_cache import ExpertCache
from specter_cache.copy_engine import DeferredCopyEngine
from specter_kernels import quantize_int4
from specter_models import ExpertsMode
from specter_models.expert_math import accumulate_experts
from specter_models.loader import load_model


class WaveSpy:
    """Wraps an ExpertCache's acquire to record, per acquisition, its hits and its waves."""

    def __init__(self, cache: ExpertCache):
        self.cache = cache
        self.log: list[tuple[int, tuple[int, ...], list[tuple[int, ...]]]] = []
        self._acquire = cache.acquire
        cache.acquire = self.acquire  # type: ignore[method-assign]

    def acquire(self, layer, experts):
        acquisition = self._acquire(layer, experts)
        waves: list[tuple[int, ...]] = []
        self.log.append((layer, acquisition.hits, waves))
        for wave in acquisition:
            waves.append(wave.experts)
            yield wave


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def test_waves_hand_out_resident_experts_first_then_arrivals(checkpoints):
    lm = load_model(
        checkpoints["tiny-qwen2-moe"], device="cpu", dtype=torch.float64, slots_per_layer=4
    )
    # A copy engine that holds every load in flight until the consumer waits for it.
    cache = ExpertCache(
        lm.cache.store, slots_per_layer=4, device="cpu", copy_engine=DeferredCopyEngine()
    )
    lm.runtime.cache = lm.cache = cache
    cache.prefetch({0: [0, 1], 1: [2, 3]})
    cache.synchronize()
    spy = WaveSpy(cache)
    ids = random_prompt(5, lm.config.vocab_size, seed=21)
    got = lm.target.forward(ids, 0)
    torch.testing.assert_close(
        got, _logits(reference_from_checkpoint(lm.source), ids), rtol=0, atol=1e-10
    )
    assert any(hits for _, hits, _ in spy.log), "some experts must have been resident"
    assert any(len(waves) > 1 for _, _, waves in spy.log), "and some must have arrived later"
    for _layer, hits, waves in spy.log:
        if hits:
            assert set(waves[0]) == set(hits)  # the resident ones, computed first
        later = [e for wave in waves[1:] for e in wave] if hits else [e for w in waves for e in w]
        assert not set(later) & set(hits)
        assert len({e for w in waves for e in w}) == sum(len(w) for w in waves)  # once each


@pytest.mark.parametrize("slots", [1, 2])
def test_fewer_slots_than_needed_experts_still_exact(checkpoints, arch_name, slots):
    lm = load_model(
        checkpoints[arch_name], device="cpu", dtype=torch.float64, slots_per_layer=slots
    )
    ids = random_prompt(9, lm.config.vocab_size, seed=slots)
    got = lm.target.forward(ids, 0)
    torch.testing.assert_close(
        got, _logits(reference_from_checkpoint(lm.source), ids), rtol=0, atol=1e-10
    )
    total = lm.cache.stats()["total"]
    assert total["overflow_acquires"] > 0
    assert total["waves"] > total["acquires"]  # needed more waves than one per layer


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_expert_wise_equals_token_wise(checkpoints, arch_name, dtype):
    logits, traces = {}, {}
    ids = random_prompt(7, 96, seed=4)
    for kind in ("expert", "token"):
        lm = load_model(
            checkpoints[arch_name], device="cpu", dtype=dtype, slots_per_layer=3, verification=kind
        )
        lm.runtime.record_routing()
        lm.target.forward(ids[:, :4], 0)
        logits[kind] = lm.target.forward(ids[:, 4:], 4).double()
        traces[kind] = lm.runtime.routing_trace
        assert lm.verification == kind
    assert traces["expert"] == traces["token"]  # same routing
    tolerance = 1e-12 if dtype == torch.float64 else 2e-3 * logits["expert"].abs().max().item()
    torch.testing.assert_close(logits["token"], logits["expert"], rtol=0, atol=tolerance)


def test_routing_trace_lists_each_forwards_needed_experts(checkpoints):
    lm = load_model(checkpoints["tiny-phimoe"], device="cpu", dtype=torch.float32)
    lm.runtime.record_routing()
    lm.target.forward(torch.tensor([[1, 2, 3]]), 0)
    lm.target.forward(torch.tensor([[4]]), 3)
    trace = lm.runtime.routing_trace
    assert len(trace) == 2
    assert all(len(steps) == 2 for steps in trace)
    assert all(len(steps[1]) == lm.config.num_experts_per_tok for steps in trace)
    lm.runtime.record_routing(False)
    assert lm.runtime.routing_trace is None
    with pytest.raises(ValueError, match="verification"):
        lm.verification = "layer"


def test_kernel_path_matches_plain_torch_on_the_same_slots(checkpoints):
    # fp16: grouped_moe_fp16 over the slots vs the plain-torch loop in float32.
    lm = load_model(
        checkpoints["tiny-deepseek-v2"], device="cpu", dtype=torch.float16, slots_per_layer=4
    )
    module = lm.experts[0]
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(6, module.hidden_dim, generator=generator).half()
    ids = torch.randint(0, module.num_experts, (6, 2), generator=generator)
    weights = torch.rand(6, 2, generator=generator)
    with lm.runtime.running(ExpertsMode.TARGET):
        got = module(x, ids, weights).float()
    store = lm.cache.store
    experts = [
        (e, store.get(0, e)["gate_up"].float(), store.get(0, e)["down"].float())
        for e in ids.unique().tolist()
    ]
    expected = accumulate_experts(
        x.float(), ids, weights, experts, torch.zeros(6, module.hidden_dim)
    )
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-3)


def test_modes_and_missing_draft_are_reported(checkpoints):
    lm = load_model(checkpoints["tiny-qwen2-moe"], device="cpu", dtype=torch.float32, draft=None)
    with pytest.raises(RuntimeError, match="outside a draft or target forward"), torch.no_grad():
        lm.model(torch.tensor([[1, 2]]))
    with (
        pytest.raises(RuntimeError, match="no INT4 draft experts"),
        lm.runtime.running(ExpertsMode.DRAFT),
        torch.no_grad(),
    ):
        lm.model(torch.tensor([[1, 2]]))
    assert lm.runtime.mode is None  # restored after the failure


def test_set_draft_weights_checks_shapes(checkpoints):
    lm = load_model(checkpoints["tiny-qwen2-moe"], device="cpu", dtype=torch.float32, draft=None)
    module = lm.experts[0]
    wrong = quantize_int4(torch.randn(8, 64, 64), 64)  # gate_up needs N = 2I = 64: fine; K ok
    down_wrong = quantize_int4(torch.randn(8, 32, 32), 32)  # down needs [8, 64, 32]
    with pytest.raises(ValueError, match=r"down \[8, 64, 32\]"):
        module.set_draft_weights(wrong, down_wrong)


def test_token_wise_with_every_expert_resident_is_the_single_wave(checkpoints):
    # No budget: nothing to load, so token-wise verification takes the all-resident wave
    # (no acquisitions, no per-row host work) and gives expert-wise's logits.
    ids = random_prompt(7, 96, seed=6)
    logits = {}
    for kind in ("expert", "token"):
        lm = load_model(checkpoints["tiny-deepseek-v2"], device="cpu", dtype=torch.float64)
        lm.verification = kind
        logits[kind] = lm.target.forward(ids, 0)
        assert lm.cache.stats()["total"]["acquires"] == 0, kind
    torch.testing.assert_close(logits["token"], logits["expert"], rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_all_resident_per_pair_accumulator_is_fully_written(checkpoints, monkeypatch, dtype):
    # With every expert resident the batch-invariant accumulator starts unzeroed: its one
    # wave must write every routed pair. Poisoned (NaN) buffers show any pair it skips.
    ids = random_prompt(6, 96, seed=8)
    lm = load_model(
        checkpoints["tiny-deepseek-v2"], device="cpu", dtype=dtype, batch_invariant=True
    )
    clean = lm.target.forward(ids, 0)
    from specter_models import specter_experts

    class Poisoned:
        def __getattr__(self, name):
            return getattr(torch, name)

        @staticmethod
        def empty(*args, **kwargs):
            return torch.empty(*args, **kwargs).fill_(float("nan"))

    monkeypatch.setattr(specter_experts, "torch", Poisoned())
    lm.reset()
    poisoned = lm.target.forward(ids, 0)
    assert torch.isfinite(poisoned).all()
    assert torch.equal(poisoned, clean)


def test_budget_waves_of_few_rows_take_pair_blocks(checkpoints, monkeypatch):
    # fp16 waves of a budgeted layer: a block per pair up to PAIR_BLOCK_ROWS rows (no
    # alignment launch), aligned above it (a prefill), auto (one row only) when resident.
    from specter_models import specter_experts

    calls: list[tuple[int, bool | None]] = []
    kernel = specter_experts.grouped_moe_fp16

    def spy(x, *args):
        calls.append((x.shape[0], args[-1] if len(args) == 8 else None))
        return kernel(x, *args)

    monkeypatch.setattr(specter_experts, "grouped_moe_fp16", spy)
    rows = specter_experts.PAIR_BLOCK_ROWS
    prompt = random_prompt(rows + 4, 96, seed=3)
    budgeted = load_model(
        checkpoints["tiny-qwen2-moe"], device="cpu", dtype=torch.float16, slots_per_layer=3
    )
    budgeted.target.forward(prompt[:, : rows + 1], 0)  # a prefill of PAIR_BLOCK_ROWS + 1 rows
    budgeted.target.forward(prompt[:, rows + 1 :], rows + 1)  # a 3-row verification
    assert {flag for t, flag in calls if t == rows + 1} == {None}
    assert {flag for t, flag in calls if t == 3} == {True}
    calls.clear()
    resident = load_model(checkpoints["tiny-qwen2-moe"], device="cpu", dtype=torch.float16)
    resident.target.forward(prompt[:, :3], 0)
    assert calls
    assert {flag for _, flag in calls} == {None}
