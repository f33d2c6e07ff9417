"""PrefetchPlanner: phases, chunk sizing from bandwidth and draft time, clamps."""

import math
import random

import pytest

from specter_cache import PlannerConfig, PrefetchPlanner
from specter_cache.prefetch_planner import PlannerPhase


def test_cold_start_observes_the_initial_chunk_only():
    planner = PrefetchPlanner(PlannerConfig(initial_chunk=3))
    planner.begin_draft(8)
    assert planner.phase is PlannerPhase.COLD_START
    assert next(t for t in range(1, 9) if planner.is_boundary(t)) == 3
    assert not planner.is_boundary(2)
    planner.begin_draft(2)  # a short draft: the initial boundary is its end
    assert planner.next_boundary == 2
    planner.begin_draft(0)
    assert planner.phase is PlannerPhase.IDLE
    assert not planner.is_boundary(0)


@pytest.mark.parametrize("seed", range(20))
def test_next_chunk_drafts_about_as_long_as_the_batch_transfers(seed):
    rng = random.Random(seed)
    planner = PrefetchPlanner(PlannerConfig(initial_chunk=1))
    bandwidth = rng.uniform(5e9, 60e9)
    token = rng.uniform(1e-4, 5e-3)
    planner.observe_bandwidth(int(bandwidth), 1.0)
    planner.observe_token_time(token)
    planner.begin_draft(1000)
    batch = rng.randint(1, 2_000_000_000)
    d = planner.decide(1, batch_experts=3, batch_bytes=batch, remaining_slots=100)
    transfer = batch / bandwidth
    assert d.transfer_seconds == pytest.approx(transfer)
    assert d.phase is PlannerPhase.PREFETCH_OVERLAP
    chunk = d.next_boundary - 1
    if chunk < 999:
        # The chunk's draft time covers the transfer, one token less would not.
        assert chunk * token >= transfer * (1 - 1e-9)
        assert chunk == 1 or (chunk - 1) * token < transfer
    assert chunk == min(999, max(1, math.ceil(transfer / token)))


def test_chunks_are_clamped_and_unknown_token_time_uses_the_initial_chunk():
    planner = PrefetchPlanner(PlannerConfig(initial_chunk=4, min_chunk=2, max_chunk=5))
    planner.begin_draft(30)
    d = planner.decide(4, batch_experts=1, batch_bytes=10**12, remaining_slots=10)
    assert d.next_boundary == 8  # no draft time measured yet: initial_chunk
    planner.observe_token_time(1e-3)
    assert planner.chunk_length(10**12) == 5  # max_chunk
    assert planner.chunk_length(0) == 2  # min_chunk
    d = planner.decide(8, batch_experts=1, batch_bytes=10**12, remaining_slots=10)
    assert d.next_boundary == 13
    d = planner.decide(28, batch_experts=1, batch_bytes=10**12, remaining_slots=10)
    assert d.next_boundary == 30  # never past the draft depth


@pytest.mark.parametrize(
    ("batch", "remaining", "tokens", "done", "phase"),
    [
        (4, 4, 2, False, PlannerPhase.FINAL_CLEANUP),  # the batch fills the remaining slots
        (3, 4, 2, False, PlannerPhase.PREFETCH_OVERLAP),
        (0, 0, 2, False, PlannerPhase.FINAL_CLEANUP),  # nothing left to fill
        (1, 4, 8, False, PlannerPhase.FINAL_CLEANUP),  # drafting reached its depth
        (1, 4, 3, True, PlannerPhase.FINAL_CLEANUP),  # the draft stopped early
    ],
)
def test_final_cleanup_conditions(batch, remaining, tokens, done, phase):
    planner = PrefetchPlanner()
    planner.begin_draft(8)
    d = planner.decide(
        tokens,
        batch_experts=batch,
        batch_bytes=batch * 100,
        remaining_slots=remaining,
        drafting_done=done,
    )
    assert d.phase is phase
    assert planner.phase is phase
    assert (d.next_boundary is None) == (phase is PlannerPhase.FINAL_CLEANUP)
    assert planner.predicting == (phase is PlannerPhase.PREFETCH_OVERLAP)
    assert planner.decisions == [d]


def test_moving_averages():
    planner = PrefetchPlanner(PlannerConfig(ema_weight=0.5, initial_bandwidth=1e9))
    planner.observe_bandwidth(4_000, 1e-6)  # first measurement replaces the assumption
    assert planner.bandwidth == pytest.approx(4e9)
    planner.observe_bandwidth(2_000, 1e-6)
    assert planner.bandwidth == pytest.approx(3e9)
    planner.observe_bandwidth(0, 1.0)  # degenerate samples are ignored
    assert planner.bandwidth == pytest.approx(3e9)
    planner.observe_token_time(2e-3)
    planner.observe_token_time(4e-3)
    assert planner.token_seconds == pytest.approx(3e-3)


def test_misuse_is_reported():
    planner = PrefetchPlanner()
    with pytest.raises(RuntimeError, match="begin_draft"):
        planner.decide(1, batch_experts=0, batch_bytes=0, remaining_slots=1)
    with pytest.raises(ValueError, match="non-negative int"):
        planner.begin_draft(-1)
    with pytest.raises(ValueError, match="max_chunk"):
        PlannerConfig(min_chunk=3, max_chunk=2)
    with pytest.raises(ValueError, match="ema_weight"):
        PlannerConfig(ema_weight=0)
    with pytest.raises(ValueError, match="initial_chunk"):
        PlannerConfig(initial_chunk=0)
