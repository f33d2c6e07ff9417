"""Expected acceptance of speculative sampling: sum_x min(p, q) = 1 - TV(p, q)."""

import math

import pytest
import torch

from specter_bench.speculative_acceptance import acceptance_key, sampled_acceptance


def _logits(seed: int, rows: int, vocab: int, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (3 * torch.randn(rows, vocab, generator=g)).to(dtype)


def test_identical_draft_and_target_accept_everything():
    logits = _logits(0, 9, 50)
    rates = sampled_acceptance(logits, logits.clone())
    assert rates.shape == (9,)
    assert rates.dtype == torch.float32
    torch.testing.assert_close(rates, torch.ones(9), atol=1e-6, rtol=0)
    # A constant shift of the logits is the same distribution.
    torch.testing.assert_close(
        sampled_acceptance(logits, logits + 4.0), torch.ones(9), atol=1e-5, rtol=0
    )


def test_a_known_pair_matches_the_hand_computation():
    # p = (0.5, 0.3, 0.2), q = (0.2, 0.2, 0.6): min-sum 0.2 + 0.2 + 0.2 = 0.6 = 1 - TV
    # (TV = (0.3 + 0.1 + 0.4) / 2 = 0.4).
    p = torch.tensor([[0.5, 0.3, 0.2]]).log()
    q = torch.tensor([[0.2, 0.2, 0.6]]).log()
    assert sampled_acceptance(p, q).item() == pytest.approx(0.6, abs=1e-6)
    # Temperature 0.5 squares and renormalises: p ~ (25, 9, 4)/38, q ~ (4, 4, 36)/44.
    p_cold, q_cold = (25 / 38, 9 / 38, 4 / 38), (4 / 44, 4 / 44, 36 / 44)
    hand = sum(min(a, b) for a, b in zip(p_cold, q_cold, strict=True))
    assert sampled_acceptance(p, q, 0.5).item() == pytest.approx(hand, abs=1e-6)


def test_matches_the_accept_probability_averaged_over_the_draft():
    # E_{x ~ q}[min(1, p(x)/q(x))] is what speculative sampling accepts; it equals 1 - TV.
    target, draft = _logits(1, 6, 40), _logits(2, 6, 40)
    p, q = torch.softmax(target.double(), -1), torch.softmax(draft.double(), -1)
    accept = (q * torch.clamp(p / q, max=1.0)).sum(-1)
    tv = 0.5 * (p - q).abs().sum(-1)
    rates = sampled_acceptance(target, draft).double()
    torch.testing.assert_close(rates, accept, atol=1e-6, rtol=0)
    torch.testing.assert_close(rates, 1 - tv, atol=1e-6, rtol=0)
    assert (rates < 1).all()
    assert (rates > 0).all()
    # Symmetric in p and q.
    torch.testing.assert_close(sampled_acceptance(draft, target), rates.float())


def test_disjoint_supports_accept_nothing_and_temperature_sharpens():
    target = torch.tensor([[30.0, -30.0, -30.0]])
    draft = torch.tensor([[-30.0, 30.0, -30.0]])
    assert sampled_acceptance(target, draft).item() == pytest.approx(0.0, abs=1e-6)
    # Same argmax, different spread: a low temperature makes both near one-hot (agree), a
    # high one flattens both to near uniform (agree too); T = 1 lies below both.
    target = torch.tensor([[2.0, 0.0, 0.0, 0.0]])
    draft = torch.tensor([[4.0, 1.0, 0.0, 0.0]])
    cold, warm, hot = (sampled_acceptance(target, draft, t).item() for t in (0.05, 1.0, 50.0))
    assert warm < cold
    assert warm < hot


def test_row_blocks_and_half_precision_give_the_float32_result():
    target, draft = _logits(3, 37, 300), _logits(4, 37, 300)
    whole = sampled_acceptance(target, draft)
    torch.testing.assert_close(sampled_acceptance(target, draft, row_block=5), whole)
    half = sampled_acceptance(target.half(), draft.half())
    assert half.dtype == torch.float32
    torch.testing.assert_close(half, whole, atol=5e-3, rtol=0)


@pytest.mark.parametrize(
    ("target", "draft", "kwargs", "error", "match"),
    [
        (torch.zeros(2, 3), torch.zeros(2, 4), {}, ValueError, r"\[T, V\]"),
        (torch.zeros(3), torch.zeros(3), {}, ValueError, r"\[T, V\]"),
        (torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3), {}, TypeError, "floating-point"),
        (torch.zeros(2, 3), [[0.0]], {}, TypeError, "draft_logits"),
        (torch.zeros(2, 3), torch.zeros(2, 3), {"temperature": 0.0}, ValueError, "temperature"),
        (torch.zeros(2, 3), torch.zeros(2, 3), {"temperature": math.inf}, ValueError, "> 0"),
        (torch.zeros(2, 3), torch.zeros(2, 3), {"row_block": 0}, ValueError, "row_block"),
    ],
)
def test_bad_input_is_refused(target, draft, kwargs, error, match):
    with pytest.raises(error, match=match):
        sampled_acceptance(target, draft, **kwargs)


def test_record_keys():
    assert acceptance_key(1.0) == "sampled_acceptance"
    assert acceptance_key(0.7) == "sampled_acceptance_t0.7"
