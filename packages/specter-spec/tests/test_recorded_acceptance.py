"""RecordedAcceptance and the controller's acceptance hook: outcomes from a recording."""

import pytest
import torch

from spec_fakes import TableLM, random_table
from specter_spec import RecordedAcceptance, SpecController
from specter_spec.statistics import IterationStats

VOCAB, PERIOD = 16, 5


class ScriptedDepth:
    """Plays a fixed list of depths, then 0."""

    def __init__(self, depths: list[int]) -> None:
        self.depths = list(depths)

    def choose_depth(self) -> int:
        return self.depths.pop(0) if self.depths else 0

    def observe(self, iteration: IterationStats) -> None:
        del iteration


def _recording(length: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (length,), generator=generator)
    agree = torch.rand(length, generator=generator) < 0.6
    return tokens, agree


def _expected_accepted(agree: torch.Tensor, n: int, depth: int) -> int:
    accepted = 0
    for p in range(n - 1, n - 1 + depth):
        if not agree[p]:
            break
        accepted += 1
    return accepted


def test_decide_takes_the_leading_run_of_agreement_and_the_recorded_next_token():
    tokens = torch.tensor([5, 6, 7, 8, 9, 10, 11, 12])
    agree = torch.tensor([True, True, False, True, True, True, False, True])
    recorded = RecordedAcceptance(tokens, agree)
    proposals = torch.tensor([0, 0, 0])
    # n = 2: flags at positions 1, 2, 3 = True, False, True -> 1 accepted, next s[3].
    committed, outcome = recorded.decide(2, proposals)
    assert committed.tolist() == [7, 8, 9]
    assert int(outcome.num_accepted) == 1
    assert int(outcome.next_token) == 8
    # n = 4: positions 3, 4, 5 all agree -> 3 accepted and the bonus token s[7].
    committed, outcome = recorded.decide(4, proposals)
    assert (int(outcome.num_accepted), int(outcome.next_token)) == (3, 12)
    # A plain step: nothing proposed, the next recorded token.
    committed, outcome = recorded.decide(5, proposals[:0])
    assert committed.numel() == 0
    assert (int(outcome.num_accepted), int(outcome.next_token)) == (0, 10)


@pytest.mark.parametrize("depths", [[3, 1, 4, 2, 5, 0, 2, 6], [6] * 10, [0] * 4 + [2] * 10])
def test_controller_commits_the_recording_and_accepts_what_its_flags_decide(depths):
    prompt_len, new = 4, 20
    tokens, agree = _recording(prompt_len + new + 8, seed=len(depths))
    target = TableLM(random_table(VOCAB, PERIOD, 0, scale=3.0))
    draft = TableLM(random_table(VOCAB, PERIOD, 1, scale=3.0))  # unrelated to the target
    controller = SpecController(
        draft, target, depth=ScriptedDepth(depths), acceptance=RecordedAcceptance(tokens, agree)
    )
    result = controller.generate(tokens[:prompt_len].tolist(), max_new_tokens=new)
    assert result.tokens == tokens[prompt_len : prompt_len + new].tolist()
    n = prompt_len
    for it in result.stats.iterations:
        assert it.accepted == _expected_accepted(agree, n, it.depth)
        n += it.committed
    assert n == prompt_len + new


def test_queued_plain_steps_commit_the_recording():
    tokens, agree = _recording(16, seed=3)
    target = TableLM(random_table(VOCAB, PERIOD, 0, scale=3.0))
    controller = SpecController(
        None, target, depth=0, pipeline_plain=True, acceptance=RecordedAcceptance(tokens, agree)
    )
    result = controller.generate(tokens[:3].tolist(), max_new_tokens=10)
    assert result.tokens == tokens[3:13].tolist()


def test_a_recording_too_short_and_a_bad_override_are_clear_errors():
    tokens, agree = _recording(6, seed=4)
    target = TableLM(random_table(VOCAB, PERIOD, 0, scale=3.0))
    controller = SpecController(None, target, depth=0, acceptance=RecordedAcceptance(tokens, agree))
    with pytest.raises(ValueError, match="holds 6 tokens; an iteration at committed length 6"):
        controller.generate(tokens[:3].tolist(), max_new_tokens=5)
    with pytest.raises(TypeError, match="acceptance must implement AcceptanceOverride"):
        SpecController(None, target, depth=0, acceptance=object())
    with pytest.raises(ValueError, match="tokens \\[N\\] and agreement flags \\[N\\]"):
        RecordedAcceptance(tokens, agree[:3])
    with pytest.raises(ValueError, match="agree bool"):
        RecordedAcceptance(tokens, agree.long())
