"""Policy replay on synthetic routing: hand-counted loads, Belady below every policy."""

import random

import pytest
import torch

from specter_bench.policy_replay import (
    PolicyReplayConfig,
    belady_loads,
    format_policy_replay,
    horizon_loads,
    lfu_loads,
    lru_loads,
    prefill_state_lru,
    replay_policies,
)
from specter_bench.routing_dump import check_dump, split_dump


def _layer(ids):
    """``[T, k=1]`` routing of one layer."""
    return torch.tensor(ids, dtype=torch.long)[:, None]


def _dump(sequences, prompt_lens, draft=True):
    """One MoE layer, top-1: ``sequences`` of expert ids per position."""
    target = [torch.tensor(s, dtype=torch.uint8)[:, None, None] for s in sequences]
    return {
        "model": "synthetic",
        "prompt_ids": [f"p{i}" for i in range(len(sequences))],
        "prompt_lens": list(prompt_lens),
        "target": target,
        "draft": [t.clone() for t in target] if draft else [],
    }


def test_lru_counts_misses_over_the_free_slots_and_skips_pinned_experts():
    # Pinned {2}; one LRU slot holding 1: 2 hit, 0 load, 2 hit, 1 load, 3 load.
    assert lru_loads(_layer([2, 0, 2, 1, 3]), {2}, [1], 1) == 3
    # No free slot: every unpinned need is a load, nothing is kept.
    assert lru_loads(_layer([0, 0, 2, 0]), {2}, [], 0) == 3


def test_prefill_state_keeps_the_most_recent_unpinned_experts_oldest_first():
    assert prefill_state_lru(_layer([0, 1, 2, 0, 3]), {3}, 2) == [2, 0]
    assert prefill_state_lru(_layer([0, 1]), set(), 0) == []


def test_belady_warm_starts_with_the_first_needed_experts():
    # Warm {2, 0}; then 1 and 3 are loads.
    assert belady_loads(_layer([2, 0, 2, 1, 3]), 2) == 2


def test_lfu_loads_over_the_lowest_count_resident_expert():
    # Prefill counts: 0 twice, 1 once -> resident {0, 1}; 2 evicts 1 (lower count), then 1
    # evicts 2 (count 1 each, 2 needed later? no: ties go by the lower count then id).
    prefill = _layer([0, 0, 1])
    assert lfu_loads(prefill, _layer([2, 1]), 2, 1.0, torch.zeros(4)) == 2
    assert lfu_loads(prefill, _layer([0, 1, 0]), 2, 1.0, torch.zeros(4)) == 0


def test_replay_of_a_tiny_dump_matches_hand_counted_loads():
    # Prompt 0 calibrates: its decode routes expert 2 most, so 2 is pinned (hot 1).
    # Prompt 1: prefill [0, 1] leaves 1 in the one LRU slot; its decode [2, 0, 2, 1, 3] loads
    # 0, 1, 3 under pinned-calib (3 of 5 tokens) and 1, 3 under Belady (2 of 5).
    dump = _dump([[1, 2, 2, 2, 3], [0, 1, 2, 0, 2, 1, 3]], [2, 3])
    config = PolicyReplayConfig(
        slots=2, hot=1, calibration=(0,), priors=(1.0,), decays=(1.0,), horizons=(1,)
    )
    seen = []
    result = replay_policies(dump, config, lambda pid, row: seen.append(pid))
    assert seen == ["p1"]
    assert result.prompt_ids == ["p1"]
    row = result.per_prompt[0]
    assert row["pinned-calib"] == pytest.approx(3 / 5)
    assert row["belady"] == pytest.approx(2 / 5)
    assert row["repin a=1.0"] == 0  # the prompt's own counts pick what is already resident
    for name, loads in row.items():
        if not name.startswith(("repin", "draft-lookahead")):
            assert row["belady"] <= loads, name
    assert "draft-lookahead h=1" in row
    text = format_policy_replay(result)
    assert "| pinned-calib | 0.60 | 0.60 |" in text
    assert "| belady | 0.40 | 0.40 |" in text


def test_replay_without_draft_routing_leaves_the_lookahead_policy_out():
    dump = _dump([[1, 2, 2, 2, 3], [0, 1, 2, 0, 2, 1, 3]], [2, 3], draft=False)
    config = PolicyReplayConfig(slots=2, hot=1, calibration=None)
    result = replay_policies(dump, config)
    assert len(result.per_prompt) == 2  # leave one out measures every prompt
    assert not any(k.startswith("draft-lookahead") for k in result.per_prompt[0])


def test_belady_is_at_most_every_policy_that_keeps_what_it_loads_on_random_traces():
    # (A bypassing policy, which reads an expert without keeping it, is outside Belady's
    # model and may go below it.)
    rng = random.Random(0)
    for _ in range(30):
        experts, slots, k = rng.randint(4, 10), rng.randint(2, 5), rng.randint(1, 2)
        slots = max(slots, k)
        prefill = torch.tensor([rng.sample(range(experts), k) for _ in range(6)])
        decode = torch.tensor([rng.sample(range(experts), k) for _ in range(25)])
        best = belady_loads(decode, slots)
        free_lru = prefill_state_lru(prefill, set(), slots)
        assert best <= lru_loads(decode, set(), free_lru, slots)
        assert best <= lfu_loads(prefill, decode, slots, 0.95, torch.zeros(experts))
        for h in (1, 4):
            loads = horizon_loads(prefill, decode, slots, h, 0.98, torch.zeros(experts), False)
            assert best <= loads


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"slots": 2, "hot": 2}, "below --slots 2"),
        ({"slots": 1, "hot": 0}, "the 2 experts a token routes to"),
        ({"calibration": (5,)}, "outside the dump's 2 prompts"),
        ({"calibration": (0, 1)}, "no prompt is left to measure"),
    ],
)
def test_a_config_that_does_not_fit_the_dump_is_refused(change, message):
    seqs = [[[1, 2], [2, 3], [0, 1], [1, 3]], [[0, 1], [2, 3], [1, 2]]]
    dump = {
        "model": "synthetic",
        "prompt_ids": ["a", "b"],
        "prompt_lens": [2, 2],
        "target": [torch.tensor(s)[:, None, :] for s in seqs],
        "draft": [],
    }
    settings = {"slots": 3, "hot": 1, "calibration": (0,), **change}
    with pytest.raises(ValueError, match=message):
        replay_policies(dump, PolicyReplayConfig(**settings))


@pytest.mark.parametrize(
    ("dump", "message"),
    [
        ([1, 2], "must be a dict"),
        ({"target": []}, "lacks"),
        (
            {
                "prompt_ids": ["a"],
                "prompt_lens": [4],
                "target": [torch.zeros(4, 1, 1)],
                "draft": [],
            },
            "at least one decoded token",
        ),
        (
            {
                "prompt_ids": ["a"],
                "prompt_lens": [1],
                "target": [torch.zeros(4, 1, 1)],
                "draft": [torch.zeros(3, 1, 1)],
            },
            "draft routing has shape",
        ),
    ],
)
def test_malformed_dumps_are_named(dump, message):
    with pytest.raises(ValueError, match=message):
        check_dump(dump)


def test_split_dump_cuts_each_sequence_at_the_last_prompt_position():
    prefills, decodes, drafts = split_dump(_dump([[1, 2, 3, 4]], [2]))
    assert prefills[0][:, 0, 0].tolist() == [1]
    assert decodes[0][:, 0, 0].tolist() == [2, 3, 4]
    assert drafts[0].shape == decodes[0].shape
