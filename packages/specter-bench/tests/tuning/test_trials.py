"""The trial loop: the gate runs before the timer, refused candidates are never timed and
never chosen, and the best is the least score among those that passed."""

import pytest
import torch

from specter_bench.tuning.trials import Launch, Trial, best_trial, relative_error, run_trials


def test_only_candidates_that_pass_the_gate_are_timed_and_can_win():
    timed = []

    def gate(c):
        if c == "raises":
            raise RuntimeError("out of resources: shared memory")
        return "wrong output" if c == "wrong" else None

    def timer(launch):
        timed.append((launch.candidate, launch.label))
        return {"wrong": 0.1, "raises": 0.1, "slow": 9.0, "fast": 2.0}[launch.candidate]

    def launches(c):
        return [Launch(c, label, lambda i: None, 4) for label in ("m1", "m5")]

    seen = []
    trials = run_trials(["wrong", "slow", "raises", "fast"], gate, launches, timer, seen.append)
    assert [t.candidate for t in trials] == ["wrong", "slow", "raises", "fast"]
    assert seen == trials
    assert trials[0].failure == "wrong output"
    assert trials[2].failure == "RuntimeError: out of resources: shared memory"
    assert not trials[0].passed
    assert trials[0].times_us == {}
    assert {c for c, _ in timed} == {"slow", "fast"}
    assert trials[3].times_us == {"m1": 2.0, "m5": 2.0}
    best = best_trial(trials, lambda times: sum(times.values()))
    assert best is trials[3]


def test_a_timer_that_fails_refuses_the_candidate():
    def timer(launch):
        raise RuntimeError("capture failed")

    (trial,) = run_trials(["a"], lambda c: None, lambda c: [Launch(c, "m1", print, 1)], timer)
    assert trial.failure == "RuntimeError: capture failed"


def test_no_passed_trial_means_no_best_and_equal_scores_keep_the_first():
    assert best_trial([Trial("a", "bad")], lambda t: 0.0) is None
    first, second = Trial("a", None, {"m1": 1.0}), Trial("b", None, {"m1": 1.0})
    assert best_trial([first, second], lambda t: t["m1"]) is first


def test_relative_error_is_infinite_for_unwritten_outputs():
    ref = torch.ones(3)
    assert relative_error(ref.clone(), ref) == 0.0
    assert relative_error(torch.tensor([1.0, 1.0, 1.1]), ref) == pytest.approx(0.1 / 3**0.5)
    assert relative_error(torch.tensor([1.0, float("nan"), 1.0]), ref) == float("inf")
