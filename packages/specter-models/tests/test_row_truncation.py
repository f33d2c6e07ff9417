"""Miss-aware row truncation: the cut rule, exact kept rows, and unchanged greedy output."""

from __future__ import annotations

import pytest
import torch

from model_helpers import random_prompt
from specter_models import RowTruncation, choose_cutoff
from specter_models.loader import load_model
from specter_spec import SamplingConfig, SpecController

# Misses so expensive that any row bringing a new missing expert is cut.
PRICEY = RowTruncation(acceptance=0.5, token_seconds=1e-6, bandwidth_bytes_per_s=1.0)


def _cut(rows, missing, **kw):
    args = {"acceptance": 0.5, "token_seconds": 1.0, "expert_seconds": 0.1, "layers_left": 1}
    return choose_cutoff(rows, missing, **(args | kw))


def test_nothing_missing_keeps_every_row():
    assert _cut([[0, 1], [2, 3], [4, 5]], set()) == 3


def test_the_cut_weighs_row_value_against_the_misses_only_they_bring():
    rows = [[0, 1], [1, 2], [5, 6], [7, 0]]
    # Row values 1, 0.5, 0.25, 0.125 s; each miss costs 0.1 s x layers_left.
    assert _cut(rows, {5, 6}) == 4  # rows 2-3 bring 2 misses (0.2 s) for 0.375 s of value
    assert _cut(rows, {5, 6}, layers_left=2) == 2  # now 0.4 s for 0.375 s: cut before row 2
    assert _cut(rows, {0}, layers_left=50) == 4  # row 0's own miss is paid whatever the cut
    assert _cut(rows, {7}, layers_left=2) == 3  # row 3 alone brings expert 7: 0.2 > 0.125
    assert _cut(rows, {2, 5, 6, 7}, expert_seconds=10.0) == 1  # row 0 is always verified


def test_ties_keep_more_rows_and_bad_arguments_are_refused():
    assert _cut([[0], [1]], {1}, acceptance=1.0, expert_seconds=1.0) == 2  # 1 s = 1 s
    with pytest.raises(ValueError, match="at least one row"):
        _cut([], set())
    with pytest.raises(ValueError, match="acceptance"):
        _cut([[0]], set(), acceptance=1.5)
    with pytest.raises(ValueError, match="layers_left"):
        _cut([[0]], set(), layers_left=0)
    with pytest.raises(ValueError, match="ema_weight"):
        RowTruncation(ema_weight=0.0)


def test_a_fixed_bandwidth_wins_over_the_measured_one():
    assert RowTruncation().bandwidth == RowTruncation.DEFAULT_BANDWIDTH
    assert RowTruncation(measured_bandwidth=50e9).bandwidth == 50e9
    assert RowTruncation(bandwidth_bytes_per_s=1.0, measured_bandwidth=50e9).bandwidth == 1.0
    with pytest.raises(ValueError, match="bandwidth_bytes_per_s"):
        RowTruncation(bandwidth_bytes_per_s=0.0)


def test_the_policy_learns_acceptance_and_token_time():
    policy = RowTruncation(acceptance=0.5, token_seconds=0.1, ema_weight=0.5)
    policy.observe(verified=4, accepted=4, seconds=0.2, committed=5)
    assert policy.acceptance == pytest.approx(0.75)
    assert policy.token_seconds == pytest.approx(0.5 * 0.1 + 0.5 * 0.04)
    policy.observe(verified=0, accepted=0)  # nothing verified: nothing learned
    assert policy.acceptance == pytest.approx(0.75)


def _load(checkpoint, **kw):
    return load_model(checkpoint, device="cpu", dtype=torch.float64, slots_per_layer=2, **kw)


def test_kept_rows_are_exact_and_prefills_are_never_cut(checkpoints, arch_name):
    lm = _load(checkpoints[arch_name], row_truncation=RowTruncation(**vars(PRICEY)))
    vocab = lm.config.vocab_size
    prompt, rows = random_prompt(6, vocab, seed=1), random_prompt(6, vocab, seed=2)
    lm.target.forward(prompt, 0)  # a prefill: truncation not allowed
    assert lm.target.verified_rows is None
    lm.runtime.record_routing()
    full = lm.target.forward(rows, 6)[0]
    assert lm.target.verified_rows is None  # not allowed outside a controller's verify
    lm.target.truncate(6)
    lm.target.allow_row_truncation = True
    cut = lm.target.forward(rows, 6)[0]
    lm.target.allow_row_truncation = False
    kept = lm.target.verified_rows
    # The trace lists what the verified rows needed: a subset of the uncut forward's needs.
    trace = lm.runtime.routing_trace
    assert all(set(steps[1]) <= set(steps[0]) for steps in trace)
    assert any(set(steps[1]) < set(steps[0]) for steps in trace)
    assert lm.runtime.row_truncation.measured_bandwidth is not None  # the planner's estimate
    assert kept is not None, "with these prices the tail rows should have been cut"
    assert 1 <= kept < rows.shape[1]
    torch.testing.assert_close(cut[:kept], full[:kept], rtol=0, atol=1e-10)


def test_speculative_greedy_with_truncation_equals_plain_greedy(checkpoints, arch_name):
    lm = _load(checkpoints[arch_name], row_truncation=RowTruncation(**vars(PRICEY)))
    prompt = random_prompt(5, lm.config.vocab_size, seed=9)[0].tolist()
    plain = SpecController(None, lm.target, depth=0).generate(prompt, 24)
    lm.reset()
    spec = SpecController(lm.draft, lm.target, cache=lm.prefetcher, depth=5).generate(prompt, 24)
    assert spec.tokens == plain.tokens
    verified = [it.verified for it in spec.stats.iterations]
    depths = [it.depth for it in spec.stats.iterations]
    assert any(v < d for v, d in zip(verified, depths, strict=True)), verified
    for it in spec.stats.iterations:
        assert 0 <= it.accepted <= it.verified <= it.depth
        assert it.bonus == (it.accepted == it.verified)
    assert not lm.target.allow_row_truncation  # only around verification forwards


def test_sampling_never_truncates(checkpoints):
    lm = _load(checkpoints["tiny-qwen2-moe"], row_truncation=RowTruncation(**vars(PRICEY)))
    prompt = random_prompt(5, lm.config.vocab_size, seed=4)[0].tolist()
    sampling = SamplingConfig(temperature=1.0)
    controller = SpecController(
        lm.draft, lm.target, cache=lm.prefetcher, depth=4, sampling=sampling
    )
    result = controller.generate(prompt, 16, generator=torch.Generator().manual_seed(3))
    assert all(it.verified == it.depth for it in result.stats.iterations)


def test_the_controller_refuses_a_cut_while_sampling(checkpoints):
    lm = _load(checkpoints["tiny-qwen2-moe"])

    class CuttingTarget:  # a target that cuts even when not allowed: a broken contract
        def __init__(self, target):
            self._target = target
            self.verified_rows = None

        def __getattr__(self, name):
            return getattr(self._target, name)

        def forward(self, ids, start):
            logits = self._target.forward(ids, start)
            self.verified_rows = 1 if ids.shape[1] > 1 and start > 0 else None
            return logits

    target = CuttingTarget(lm.target)
    controller = SpecController(lm.draft, target, depth=3, sampling=SamplingConfig(temperature=1.0))
    prompt = random_prompt(5, lm.config.vocab_size, seed=4)[0].tolist()
    with pytest.raises(RuntimeError, match="greedy decoding only"):
        controller.generate(prompt, 8, generator=torch.Generator().manual_seed(1))
