"""AdaptiveDepth: acceptance and cost estimates, the depth they imply, recovery from K=0."""

import itertools
import json
import random

import pytest

from spec_fakes import ShiftedDraft, TableLM, VirtualClock, random_table
from specter_spec import (
    AdaptiveDepth,
    AdaptiveDepthConfig,
    IterationStats,
    SpecController,
    expected_committed,
)


class Environment:
    """Synthetic iterations: i.i.d. acceptance ``alpha`` and linear costs, in seconds."""

    def __init__(self, alpha, draft_cost, verify_fixed, verify_per_row, overhead=0.0, seed=0):
        self.alpha, self.draft_cost = alpha, draft_cost
        self.verify_fixed, self.verify_per_row, self.overhead = (
            verify_fixed,
            verify_per_row,
            overhead,
        )
        self.rng = random.Random(seed)

    def draft(self, depth):
        """Draft time of an iteration of depth K."""
        return depth * self.draft_cost

    def verify(self, rows):
        """Verify time of ``rows`` rows."""
        return self.verify_fixed + self.verify_per_row * rows

    def iteration(self, depth):
        accepted = 0
        while accepted < depth and self.rng.random() < self.alpha:
            accepted += 1
        draft, verify = self.draft(depth), self.verify(depth + 1)
        return IterationStats(
            depth=depth,
            accepted=accepted,
            bonus=accepted == depth,
            committed=accepted + 1,
            draft_time_s=draft,
            verify_time_s=verify,
            total_time_s=draft + verify + self.overhead,
        )

    def rate(self, depth):
        """True expected committed tokens per second at depth K."""
        seconds = self.overhead + self.draft(depth) + self.verify(depth + 1)
        return expected_committed(self.alpha, depth) / seconds


class BudgetEnvironment(Environment):
    """The shape of DeepSeek-V2-Lite's costs under a 24 GB budget on one H200:
    verify time concave in the rows (each row needs fewer experts the others did not: 16 ms
    for one row, 24 ms for two, 40 ms for seven) and a draft iteration with a fixed part
    (7.9 ms at K = 1, 24 ms at K = 6)."""

    def __init__(self, alpha=0.9, seed=0):
        super().__init__(alpha, 0.0, 0.0, 0.0, seed=seed)

    def verify(self, rows):
        return 4.35e-3 + 38.8e-3 * (1 - 0.7**rows)

    def draft(self, depth):
        return 0.0 if depth == 0 else 4.64e-3 + 3.26e-3 * depth


def run(policy, env, iterations):
    depths = []
    for _ in range(iterations):
        depth = policy.choose_depth()
        depths.append(depth)
        policy.observe(env.iteration(depth))
    return depths


def test_expected_committed_is_the_truncated_geometric_sum():
    for alpha in (0.0, 0.3, 0.9, 0.999):
        for depth in (0, 1, 5, 32):
            assert expected_committed(alpha, depth) == pytest.approx(
                sum(alpha**i for i in range(depth + 1))
            )
    assert expected_committed(1.0, 7) == 8.0


def test_estimates_converge_to_the_environment():
    env = Environment(
        alpha=0.8, draft_cost=1e-3, verify_fixed=10e-3, verify_per_row=1e-3, overhead=0.5e-3
    )
    config = AdaptiveDepthConfig(max_depth=8, acceptance_decay=0.995, cost_decay=0.9)
    policy = AdaptiveDepth(config)
    run(policy, env, 3000)
    assert policy.acceptance == pytest.approx(0.8, abs=0.05)
    assert policy.draft_cost_s == pytest.approx(1e-3, rel=1e-6)
    assert len(policy.verify_costs) >= 2  # the best depth and its probes
    for rows in range(1, 10):  # measured, interpolated and extrapolated alike
        assert policy.verify_cost_s(rows) == pytest.approx(10e-3 + 1e-3 * rows, rel=1e-6)
    for depth in range(1, 9):
        assert policy.draft_time_s(depth) == pytest.approx(1e-3 * depth, rel=1e-6)
    assert policy.draft_time_s(0) == 0.0
    assert policy.overhead_s == pytest.approx(0.5e-3, rel=1e-6)


def test_high_acceptance_and_cheap_drafting_choose_a_large_depth():
    env = Environment(alpha=0.95, draft_cost=0.2e-3, verify_fixed=10e-3, verify_per_row=0.1e-3)
    policy = AdaptiveDepth(AdaptiveDepthConfig(max_depth=16))
    depths = run(policy, env, 400)
    best_rate = max(env.rate(k) for k in range(17))
    chosen = policy.best_depth()
    assert chosen >= 8
    assert env.rate(chosen) >= 0.97 * best_rate  # near-optimal under the true model
    assert sorted(depths[-100:])[50] >= 8  # most iterations actually ran deep


def test_low_acceptance_and_expensive_drafting_turn_speculation_off():
    env = Environment(alpha=0.1, draft_cost=8e-3, verify_fixed=10e-3, verify_per_row=0.5e-3)
    config = AdaptiveDepthConfig(max_depth=16, probe_interval=8)
    policy = AdaptiveDepth(config)
    depths = run(policy, env, 400)
    assert policy.best_depth() == 0
    assert max(range(17), key=env.rate) == 0  # the truth agrees
    tail = depths[-160:]
    assert tail.count(0) >= len(tail) * (1 - 1 / config.probe_interval) - 1
    # Only probes interrupt plain decoding: K = 1 and initial_depth in turn.
    assert set(tail) <= {0, 1, config.initial_depth}
    assert {1, config.initial_depth} <= set(tail)


def test_concave_verify_and_a_fixed_draft_part_still_go_deep():
    # K = 1 loses to plain decoding here, and a line through the verify times of 1 and 2
    # rows (or a draft cost per proposal measured at K = 1) says every deeper K loses too;
    # the measured times at the deeper probe show K around 6 wins by a quarter.
    env = BudgetEnvironment(alpha=0.9)
    assert env.rate(1) < env.rate(0)
    best = max(range(17), key=env.rate)
    assert best >= 5
    assert env.rate(best) > 1.25 * env.rate(0)
    for seed in range(3):
        env = BudgetEnvironment(alpha=0.9, seed=seed)
        policy = AdaptiveDepth(AdaptiveDepthConfig(max_depth=16))
        depths = run(policy, env, 300)
        assert env.rate(policy.best_depth()) >= 0.95 * env.rate(best)
        assert sorted(depths[-100:])[50] >= 4  # most late iterations ran deep
        chosen = policy.best_depth()  # measured around here: the estimates are the truth
        assert policy.verify_cost_s(chosen + 1) == pytest.approx(env.verify(chosen + 1), rel=0.02)
        assert policy.draft_time_s(chosen) == pytest.approx(env.draft(chosen), rel=0.02)


def test_probes_back_off_while_they_confirm_the_best_depth():
    # Plain decoding wins throughout: each probe at K=1 confirms it, so probes thin out from
    # every 8th iteration to every 32nd (where the fit still remembers the probed row count).
    env = Environment(alpha=0.1, draft_cost=8e-3, verify_fixed=10e-3, verify_per_row=0.5e-3)
    config = AdaptiveDepthConfig(max_depth=16, probe_interval=8, max_probe_interval=32)
    policy = AdaptiveDepth(config)
    depths = run(policy, env, 400)
    assert policy.probe_interval == 32
    assert policy.best_depth() == 0
    probes = [i for i, d in enumerate(depths[20:], start=20) if d != 0]
    assert len(probes) <= 400 // 32 + 2  # a fixed interval would probe about 50 times
    gaps = [b - a for a, b in itertools.pairwise(probes)]
    assert gaps
    assert all(gap == 32 for gap in gaps[-5:])
    fixed = AdaptiveDepth(AdaptiveDepthConfig(max_depth=16, probe_interval=8, max_probe_interval=8))
    assert sum(d != 0 for d in run(fixed, env, 400)[20:]) >= 45


def test_a_probe_that_changes_the_best_depth_resets_the_interval():
    policy = AdaptiveDepth(AdaptiveDepthConfig(max_depth=16, probe_interval=4))
    bad = Environment(alpha=0.05, draft_cost=5e-3, verify_fixed=10e-3, verify_per_row=0.2e-3)
    good = Environment(alpha=0.97, draft_cost=0.2e-3, verify_fixed=10e-3, verify_per_row=0.2e-3)
    run(policy, bad, 300)
    assert policy.probe_interval == 32  # the default cap
    seen = []
    for _ in range(200):
        depth = policy.choose_depth()
        seen.append(policy.probe_interval)
        policy.observe(good.iteration(depth))
    assert 4 in seen  # the probe that found speculation paying brought probes back


def test_recovers_from_plain_decoding_when_speculation_starts_to_pay():
    policy = AdaptiveDepth(AdaptiveDepthConfig(max_depth=16, probe_interval=4))
    bad = Environment(alpha=0.05, draft_cost=5e-3, verify_fixed=10e-3, verify_per_row=0.2e-3)
    good = Environment(alpha=0.97, draft_cost=0.2e-3, verify_fixed=10e-3, verify_per_row=0.2e-3)
    assert run(policy, bad, 200)[-50:].count(0) >= 35
    depths = run(policy, good, 300)
    assert sorted(depths[-100:])[50] >= 8


def test_reset_forgets_and_first_choice_is_the_initial_depth():
    policy = AdaptiveDepth(AdaptiveDepthConfig(initial_depth=3, max_depth=8))
    assert policy.choose_depth() == 3
    run(policy, Environment(0.9, 1e-3, 1e-2, 1e-3), 20)
    assert policy.verify_cost_s(4) is not None
    policy.reset()
    assert policy.verify_cost_s(4) is None
    assert policy.verify_costs == {}
    assert policy.draft_time_s(1) is None
    assert policy.draft_cost_s is None
    assert policy.choose_depth() == 3


# -- driving a controller through a virtual clock ---------------------------------------------


def _controller(policy, wrong, draft_cost):
    clock = VirtualClock()
    target = TableLM(
        random_table(vocab=13, period=4, seed=3),
        clock=clock,
        cost=lambda tokens, start: 10e-3 + 0.1e-3 * tokens,
    )
    draft = ShiftedDraft(target, wrong, clock=clock, cost=lambda tokens, start: draft_cost)
    return SpecController(draft, target, depth=policy, clock=clock), target


def _greedy_reference(target, prompt, count):
    tokens = list(prompt)
    for _ in range(count):
        tokens.append(int(target.next_probs(tokens).argmax()))
    return tokens[len(prompt) :]


@pytest.mark.parametrize(
    ("wrong", "draft_cost", "expect_deep"),
    [(lambda index: False, 0.2e-3, True), (lambda index: True, 8e-3, False)],
    ids=["good-draft", "useless-draft"],
)
def test_controller_with_adaptive_depth_goes_deep_or_off_and_stays_exact(
    wrong, draft_cost, expect_deep
):
    policy = AdaptiveDepth(AdaptiveDepthConfig(max_depth=12, probe_interval=8))
    controller, target = _controller(policy, wrong, draft_cost)
    result = controller.generate([1, 2, 3], 300)
    assert result.tokens == _greedy_reference(target, [1, 2, 3], 300)
    depths = [it.depth for it in result.stats.iterations][10:-2]  # past the warm start
    median = sorted(depths)[len(depths) // 2]
    if expect_deep:
        assert median == 12
    else:
        assert median == 0
        assert sum(d == 0 for d in depths) >= 0.8 * len(depths)


def test_acceptance_counts_only_verified_proposals_when_rows_were_cut():
    # Every verified proposal accepted, but only 2 of 6 verified: the estimate tends to 1,
    # not to 2 of 3 (a cut tail is not a rejection).
    def estimate(verified, bonus):
        policy = AdaptiveDepth(AdaptiveDepthConfig(max_depth=8, acceptance_decay=0.5))
        for _ in range(20):
            policy.observe(
                IterationStats(
                    depth=6,
                    accepted=2,
                    bonus=bonus,
                    committed=3,
                    draft_time_s=1e-3,
                    verify_time_s=2e-3,
                    total_time_s=3e-3,
                    verified=verified,
                )
            )
        return policy.acceptance

    assert estimate(verified=2, bonus=True) == pytest.approx(1.0, abs=1e-4)
    assert estimate(verified=None, bonus=False) == pytest.approx(2 / 3, abs=1e-4)


def test_best_depth_is_the_argmax_of_expected_rate():
    # best_depth sweeps both fitted cost curves in one pass; expected_rate prices one depth
    # at a time. They must agree, the smallest K on ties, whatever depths were measured.
    for seed in range(12):
        rng = random.Random(seed)
        if seed % 2:
            env = BudgetEnvironment(alpha=0.9, seed=seed)
        else:
            env = Environment(
                rng.random(), 1e-3 * rng.random(), 1e-2, 1e-3 * rng.random(), seed=seed
            )
        policy = AdaptiveDepth(AdaptiveDepthConfig(max_depth=12))
        for i in range(150):
            depth = policy.choose_depth()
            policy.observe(env.iteration(rng.randrange(13) if i % 3 == 0 else depth))
            rates = [policy.expected_rate(k) for k in range(13)]
            expected = None if rates[0] is None else max(range(13), key=lambda k: (rates[k], -k))
            assert policy.best_depth() == expected


class PipelinedEnvironment(Environment):
    """Every expert resident, plain steps queued ahead (the shape of Qwen1.5-MoE's costs
    without a budget on one H200): a plain step costs 4.0 ms alone (the host's work before
    it shows) but 3.6 ms in a run (hidden behind the previous step); speculation at K costs
    a 0.3 ms draft base plus 3.0 ms per proposal and a 3.9 + 0.15 ms-per-row verification,
    with 0.2 ms of commit. The best rate is plain decoding in runs (3.6 ms a token), then
    K = 2-4 (about 3.74 ms), then lone plain steps (4.2 ms)."""

    def __init__(self, queued: bool, seed: int = 0) -> None:
        super().__init__(0.95, 3.0e-3, 3.9e-3, 0.15e-3, overhead=0.2e-3, seed=seed)
        self.queued = queued
        self.previous = None

    def draft(self, depth):
        return 0.0 if depth == 0 else 0.3e-3 + depth * self.draft_cost

    def iteration(self, depth):
        previous, self.previous = self.previous, depth
        if depth > 0:
            return super().iteration(depth)
        in_run = self.queued and previous == 0
        seconds = 3.6e-3 if in_run else 4.0e-3 + self.overhead
        return IterationStats.plain_step(seconds, pipelined=in_run)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pipelined_plain_steps_are_priced_at_their_steady_state(seed):
    # A K = 0 probe runs its plain steps in a row, so the queued ones show their steady
    # state (flagged pipelined) and plain decoding wins, as it should.
    policy = AdaptiveDepth()
    env = PipelinedEnvironment(True, seed)
    late = []
    for i in range(400):
        depth = policy.choose_depth()
        iteration = env.iteration(depth)
        policy.observe(iteration)
        if i >= 250:
            late.append(iteration)
    assert [it.depth for it in late].count(0) >= 120
    assert policy.steady_plain_s == pytest.approx(3.6e-3, rel=1e-6)
    assert policy.best_depth() == 0
    seconds = sum(it.total_time_s for it in late) / sum(it.committed for it in late)
    assert seconds < 3.68e-3  # within about 2% of the steady plain step
    assert policy.expected_rate(0) == pytest.approx(1 / 3.6e-3, rel=1e-6)
    # A controller that runs every plain step alone (no queue) never shows a steady state:
    # plain decoding is priced at its one-row verification and commit (4.2 ms a token).
    alone = AdaptiveDepth()
    run(alone, PipelinedEnvironment(False, seed), 400)
    assert alone.steady_plain_s is None
    assert alone.expected_rate(0) == pytest.approx(1 / 4.2e-3, rel=0.03)


def test_a_generations_first_iteration_teaches_acceptance_but_no_cost():
    # Right after a prefill an iteration carries the prefill's queued work and first uses:
    # drafting 4 proposals took 25 ms there on one H200 against 13 later.
    flagged, unflagged = AdaptiveDepth(), AdaptiveDepth()
    flagged.observe(IterationStats(4, 3, False, 4, 25e-3, 23e-3, 49e-3, first=True))
    unflagged.observe(IterationStats(4, 3, False, 4, 25e-3, 23e-3, 49e-3))
    assert flagged.acceptance == unflagged.acceptance != AdaptiveDepth().acceptance
    assert flagged.draft_times == {}
    assert flagged.verify_costs == {}
    assert flagged.overhead_s == 0.0
    assert unflagged.draft_times == {4: pytest.approx(25e-3)}
    steady = IterationStats(4, 4, True, 5, 13e-3, 15e-3, 28.5e-3)
    for policy in (flagged, unflagged):
        policy.observe(steady)
    assert flagged.draft_times == {4: pytest.approx(13e-3)}
    assert flagged.verify_costs == {5: pytest.approx(15e-3)}
    assert flagged.overhead_s == pytest.approx(0.5e-3)
    assert unflagged.draft_times[4] > 14e-3  # the first iteration still in its mean


def test_a_deep_best_depth_still_probes_plain_decoding_in_runs():
    env = Environment(alpha=0.9, draft_cost=0.5e-3, verify_fixed=10e-3, verify_per_row=0.5e-3)
    config = AdaptiveDepthConfig(max_depth=16, probe_interval=4, max_probe_interval=8)
    policy = AdaptiveDepth(config)
    depths = run(policy, env, 300)
    assert policy.best_depth() >= 4
    runs = [len(list(group)) for depth, group in itertools.groupby(depths[50:]) if depth == 0]
    assert runs  # plain decoding is probed now and then, though speculation wins
    assert set(runs) == {config.plain_probe_steps}  # each probe, its plain steps in a row
    assert sum(runs) <= 0.15 * 250


def test_plain_and_speculative_iterations_keep_their_own_overhead():
    policy = AdaptiveDepth()
    for _ in range(50):
        policy.observe(IterationStats(0, 0, True, 1, 0.0, 3e-3, 3.1e-3))
        policy.observe(IterationStats(4, 4, True, 5, 8e-3, 5e-3, 13.5e-3))
    assert policy.plain_overhead_s == pytest.approx(0.1e-3)
    assert policy.overhead_s == pytest.approx(0.5e-3)
    with pytest.raises(ValueError, match="plain_probe_steps"):
        AdaptiveDepthConfig(plain_probe_steps=0)


class ResidentEnvironment(Environment):
    """The shape of DeepSeek-V2-Lite's costs with every expert resident on one H200: a draft
    step of 1.9 ms, nearly a one-row target step (2.14 ms), and
    verify times of 2.14 ms at one row, 2.48 at two and 3.5 at five. Every proposal is
    accepted, and still no depth beats plain decoding."""

    def __init__(self, alpha=1.0, seed=0):
        super().__init__(alpha, 1.9e-3, 1.8e-3, 0.34e-3, seed=seed)


def test_probes_of_depths_that_cannot_pay_are_skipped_until_their_costs_expire():
    env = ResidentEnvironment()
    assert all(env.rate(k) < env.rate(0) for k in range(1, 17))
    assert env.rate(1) > 0.97 * env.rate(0)  # K = 1 nearly breaks even: a close call
    runs = {}
    for skip in (False, True):
        config = AdaptiveDepthConfig(max_depth=16, skip_losing_probes=skip)
        policy = AdaptiveDepth(config)
        depths = run(policy, env, 600)
        assert policy.best_depth() == 0
        runs[skip] = (depths[100:], policy)
    plain_probes = sum(d != 0 for d in runs[False][0])
    skipped_probes = sum(d != 0 for d in runs[True][0])
    policy = runs[True][1]
    assert policy.skipped_probes > 0
    assert runs[False][1].skipped_probes == 0
    # About half the probes run: each depth's costs live cost_horizon iterations, and its
    # turn comes every 2 x max_probe_interval, so every other turn finds them expired.
    assert 0 < skipped_probes <= 0.6 * plain_probes
    # The probes that do run keep measuring both depths (the costs never go stale for good).
    probed = {d for d in runs[True][0] if d != 0}
    assert probed == {1, policy.config.initial_depth}


def test_a_depth_is_never_judged_on_extrapolated_costs():
    # Only K = 1 measured: the curves reach K = 4 by extrapolation, which cannot say K = 4
    # loses (under a budget the verify cost is concave and deep speculation can win where
    # K = 1 does not), so K = 4's probe is not skipped.
    policy = AdaptiveDepth(AdaptiveDepthConfig(max_depth=16))
    env = ResidentEnvironment()
    for depth in (0, 1, 0, 1, 0):
        policy.observe(env.iteration(depth))
    assert policy.cannot_pay(1)
    assert not policy.cannot_pay(4)
    assert not policy.cannot_pay(0)
    with pytest.raises(ValueError, match="skip_losing_probes"):
        AdaptiveDepthConfig(skip_losing_probes=1)


def test_skipped_probes_resume_when_speculation_starts_to_pay():
    # Resident costs first (probes skipped), then a cheap draft: once the skipped depths'
    # costs expire their probes run, see the new costs, and speculation comes back.
    policy = AdaptiveDepth(AdaptiveDepthConfig(max_depth=16))
    run(policy, ResidentEnvironment(), 300)
    assert policy.skipped_probes > 0
    good = Environment(alpha=0.97, draft_cost=0.2e-3, verify_fixed=2e-3, verify_per_row=0.1e-3)
    depths = run(policy, good, 400)
    assert sorted(depths[-100:])[50] >= 8


def test_a_policy_primed_with_anothers_costs_starts_at_its_best_depth():
    # A run's measured costs carried to a fresh policy: its first choice is the depth those
    # costs favour, with no exploration of the depths they already priced.
    env = BudgetEnvironment(alpha=0.9)
    learned = AdaptiveDepth(AdaptiveDepthConfig(max_depth=8))
    run(learned, env, 200)
    costs = learned.export_costs()
    assert costs["draft"]
    assert costs["verify"]
    fresh = AdaptiveDepth(AdaptiveDepthConfig(max_depth=8))
    unprimed_first = fresh.choose_depth()
    assert unprimed_first == fresh.config.initial_depth  # knows nothing: starts exploring
    fresh.reset()
    fresh.prime(json.loads(json.dumps(costs)))  # as a file stores it
    assert fresh.verify_costs == pytest.approx(learned.verify_costs)
    assert fresh.draft_times == pytest.approx(learned.draft_times)
    assert fresh.acceptance == fresh.config.prior_acceptance  # a prompt's, not carried over
    # at the learned acceptance both policies price every depth alike
    fresh._accepted, fresh._trials = learned._accepted, learned._trials
    assert fresh.best_depth() == learned.best_depth()
    first = [fresh.choose_depth() for _ in range(fresh.config.probe_interval - 1)]
    assert first == [learned.best_depth()] * len(first)


def test_primed_costs_give_way_to_measured_ones_and_expire():
    env = Environment(alpha=0.8, draft_cost=1e-3, verify_fixed=10e-3, verify_per_row=1e-3)
    config = AdaptiveDepthConfig(max_depth=8)
    policy = AdaptiveDepth(config)
    wrong = {"draft": {"2": 50e-3}, "verify": {"1": 10e-3, "3": 90e-3, "9": 200e-3}}
    policy.prime(wrong)  # prices speculation far too dear: starts plainly
    assert policy.choose_depth() == 0
    depths = run(policy, env, 200)
    assert policy.best_depth() > 0  # speculation came back on measured costs
    assert 2 in depths  # the primed depth ran and was measured again ...
    assert policy.verify_cost_s(3) == pytest.approx(env.verify(3), rel=0.05)  # ... and won
    assert policy.draft_time_s(2) == pytest.approx(env.draft(2), rel=0.05)
    # a count never measured again is forgotten after cost_horizon iterations
    stale = AdaptiveDepth(config)
    stale.prime(wrong)
    run(stale, Environment(0.8, 1e-3, 10e-3, 1e-3), config.cost_horizon + 1)
    assert 9 not in stale.verify_costs


def test_primed_costs_keep_their_age_across_runs():
    # A count the earlier run measured long ago expires when it would have there, so a
    # cost no later run measures again is not carried from run to run for ever.
    config = AdaptiveDepthConfig(max_depth=8)
    env = Environment(alpha=0.8, draft_cost=1e-3, verify_fixed=10e-3, verify_per_row=1e-3)
    first = AdaptiveDepth(config)
    run(first, env, 40)
    costs = first.export_costs()
    ages = costs["ages"]
    assert set(ages["verify"]) == set(costs["verify"])
    assert all(0 <= a < 40 for a in ages["verify"].values())
    second = AdaptiveDepth(config)
    second.prime(costs)
    assert second.verify_costs == pytest.approx(first.verify_costs)
    assert second.export_costs()["ages"] == ages  # none of them measured again yet
    old = json.loads(json.dumps(costs))
    old["ages"]["verify"] = dict.fromkeys(old["verify"], config.cost_horizon)
    third = AdaptiveDepth(config)
    third.prime(old)
    assert third.verify_costs == {}  # all of them past the horizon
    assert third.draft_times == pytest.approx(first.draft_times)
    with pytest.raises(RuntimeError, match="prime a fresh AdaptiveDepth"):
        first.prime(costs)  # it has measured costs of its own
