"""GenerationStats totals and their plain-Python views."""

import json

import pytest

from specter_spec import GenerationResult, GenerationStats, IterationStats


def _iteration(depth, accepted, committed=None, draft=0.0, verify=0.0, total=None):
    return IterationStats(
        depth=depth,
        accepted=accepted,
        bonus=accepted == depth,
        committed=accepted + 1 if committed is None else committed,
        draft_time_s=draft,
        verify_time_s=verify,
        total_time_s=draft + verify if total is None else total,
    )


def test_totals_follow_the_definitions():
    iterations = [
        _iteration(4, 4, draft=0.4, verify=0.2, total=0.7),  # bonus
        _iteration(4, 1, draft=0.4, verify=0.2, total=0.6),  # correction
        _iteration(0, 0, verify=0.1, total=0.1),  # plain decoding: a bonus token
        _iteration(3, 2, committed=1, draft=0.3, verify=0.2, total=0.5),  # stop token cut
    ]
    stats = GenerationStats(prompt_length=5, prefill_time_s=0.3, iterations=iterations)
    assert stats.num_iterations == 4
    assert stats.new_tokens == 5 + 2 + 1 + 1
    assert stats.proposed == 11
    assert stats.accepted == 7
    assert stats.bonuses == 2
    assert stats.corrections == 2
    assert stats.acceptance_rate == pytest.approx(7 / 11)
    assert stats.mean_accepted_per_iteration == pytest.approx(7 / 4)
    assert stats.mean_committed_per_iteration == pytest.approx(9 / 4)
    assert stats.mean_depth == pytest.approx(11 / 4)
    assert stats.draft_time_s == pytest.approx(1.1)
    assert stats.verify_time_s == pytest.approx(0.7)
    assert stats.decode_time_s == pytest.approx(1.9)
    assert stats.tpot_s == pytest.approx(1.9 / 9)  # prefill excluded
    assert iterations[1].correction
    assert iterations[1].proposed == 4


def test_empty_generation_has_no_rates():
    stats = GenerationStats(prompt_length=3)
    assert stats.tpot_s is None
    assert stats.acceptance_rate is None
    assert stats.mean_accepted_per_iteration is None


def test_as_dict_is_json_and_agrees_with_the_properties():
    stats = GenerationStats(prompt_length=2, iterations=[_iteration(2, 1), _iteration(2, 2)])
    result = GenerationResult(tokens=[7, 8, 9, 1, 2], stop_reason="max_new_tokens", stats=stats)
    view = json.loads(json.dumps(result.as_dict()))
    assert view["tokens"] == [7, 8, 9, 1, 2]
    assert view["accepted"] == stats.accepted == 3
    assert view["proposed"] == 4
    assert view["acceptance_rate"] == pytest.approx(0.75)
    assert [it["accepted"] for it in view["per_iteration"]] == [1, 2]
    assert [it["bonus"] for it in view["per_iteration"]] == [False, True]
    assert "per_iteration" not in stats.as_dict(per_iteration=False)
