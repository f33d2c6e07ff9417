"""Greedy and exact sampled acceptance, tested on synthetic distributions."""

import pytest
import torch

from spec_fakes import biased_rejection_sampler, chi_square_p_value
from specter_spec.acceptance import (
    acceptance_probability,
    greedy_accept,
    rejection_sample,
    residual_distribution,
)

ALPHA = 0.001  # significance level of every chi-square test


def _random_dist(*shape: int, gen: torch.Generator, sharpness: float = 1.5) -> torch.Tensor:
    return torch.softmax(torch.randn(*shape, generator=gen, dtype=torch.float64) * sharpness, -1)


# -- greedy ------------------------------------------------------------------------------


@pytest.mark.parametrize("depth", [0, 1, 3, 8])
def test_greedy_accepts_longest_matching_prefix_then_target_token(depth):
    gen = torch.Generator().manual_seed(depth)
    batch, vocab = 512, 7
    logits = torch.randn(batch, depth + 1, vocab, generator=gen)
    target_tokens = logits.argmax(-1)
    # Each proposal is right with probability 0.7, else a different token.
    wrong = torch.rand(batch, depth, generator=gen) > 0.7
    drafts = torch.where(wrong, (target_tokens[:, :depth] + 1) % vocab, target_tokens[:, :depth])

    result = greedy_accept(drafts, logits)

    for b in range(batch):
        a = 0
        while a < depth and drafts[b, a] == target_tokens[b, a]:
            a += 1
        assert result.num_accepted[b] == a
        assert result.next_token[b] == target_tokens[b, a]
    if depth > 0:  # every accepted count occurs in this many trials
        assert set(result.num_accepted.tolist()) == set(range(depth + 1))


def test_greedy_takes_the_given_argmax():
    # The given argmax picks the tokens: one that answers the second-largest logit's index
    # accepts the proposals that match it and returns its token.
    logits = torch.tensor([[[0.0, 3.0, 2.0], [5.0, 1.0, 4.0], [1.0, 0.0, 2.0]]])

    def second(x):
        return x.argsort(dim=-1, descending=True)[..., 1]

    result = greedy_accept(torch.tensor([[2, 2]]), logits, second)
    assert result.num_accepted.tolist() == [2]
    assert result.next_token.tolist() == [0]
    plain = greedy_accept(torch.tensor([[2, 2]]), logits)
    assert plain.num_accepted.tolist() == [0]
    assert plain.next_token.tolist() == [1]


def test_greedy_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match=r"\[\.\.\., K\+1, V\]"):
        greedy_accept(torch.zeros(3, dtype=torch.long), torch.zeros(3, 5))


# -- the exact law, analytically -----------------------------------------------------------


def _output_law(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """P(committed token = x) for one proposal x ~ q, from the module's own probabilities.

    The proposal x survives with probability accept(x); otherwise the token comes
    from the residual. So P(x) = q(x) accept(x) + (1 - sum_y q(y) accept(y)) residual(x).
    """
    vocab = p.shape[-1]
    every_token = torch.arange(vocab)
    accept = acceptance_probability(p.expand(vocab, vocab), q.expand(vocab, vocab), every_token)
    kept = q * accept
    return kept + (1 - kept.sum()) * residual_distribution(p, q)


def _edge_cases():
    gen = torch.Generator().manual_seed(0)
    p = _random_dist(6, gen=gen)
    yield "p equals q", p, p.clone()
    yield (
        "disjoint supports",
        torch.tensor([0.5, 0.5, 0, 0, 0, 0]),
        torch.tensor([0, 0, 0.2, 0.3, 0.5, 0]),
    )
    yield "one-hot q inside p's support", p, torch.nn.functional.one_hot(torch.tensor(2), 6)
    yield (
        "one-hot q outside p's support",
        torch.tensor([0.3, 0.7, 0, 0, 0, 0]),
        (torch.nn.functional.one_hot(torch.tensor(4), 6)),
    )
    yield "one-hot p", torch.nn.functional.one_hot(torch.tensor(1), 6), _random_dist(6, gen=gen)
    yield "p equals one-hot q", *(torch.nn.functional.one_hot(torch.tensor(3), 6),) * 2
    yield "random full support", _random_dist(6, gen=gen), _random_dist(6, gen=gen)
    yield (
        "q sharper than p",
        _random_dist(6, gen=gen, sharpness=0.3),
        _random_dist(6, gen=gen, sharpness=4.0),
    )


@pytest.mark.parametrize(
    ("name", "p", "q"), list(_edge_cases()), ids=lambda v: v if isinstance(v, str) else ""
)
def test_min_p_q_plus_residual_mass_is_exactly_p(name, p, q):
    p, q = p.to(torch.float64), q.to(torch.float64)
    law = _output_law(p, q)
    assert not torch.isnan(law).any(), name
    torch.testing.assert_close(law, p, rtol=0, atol=1e-12)
    # The accepted part alone is min(p, q): the acceptance probability is right.
    vocab = p.shape[-1]
    accept = acceptance_probability(
        p.expand(vocab, vocab), q.expand(vocab, vocab), torch.arange(vocab)
    )
    torch.testing.assert_close(q * accept, torch.minimum(p, q), rtol=0, atol=1e-12)


def test_proposal_the_draft_gives_zero_probability_is_rejected_without_nan():
    p = torch.tensor([0.25, 0.25, 0.5])
    q = torch.tensor([0.5, 0.5, 0.0])  # proposal 2 is "impossible" for the draft
    assert acceptance_probability(p, q, torch.tensor(2)) == 0
    assert acceptance_probability(torch.zeros(3), torch.zeros(3), torch.tensor(0)) == 0
    # Through the sampler: every trial rejects at once and corrects from the residual [0,0,1].
    trials = 1000
    result = rejection_sample(
        torch.full((trials, 1), 2),
        q.expand(trials, 1, 3),
        p.expand(trials, 2, 3),
        torch.Generator().manual_seed(0),
    )
    assert (result.num_accepted == 0).all()
    assert (result.next_token == 2).all()


def test_residual_is_normalised_positive_part_or_p_without_mass():
    p = torch.tensor([0.1, 0.6, 0.3])
    q = torch.tensor([0.4, 0.2, 0.4])
    torch.testing.assert_close(residual_distribution(p, q), torch.tensor([0.0, 1.0, 0.0]))
    torch.testing.assert_close(residual_distribution(p, p), p)
    torch.testing.assert_close(residual_distribution(p, torch.zeros(3)), p)


# -- sampled, statistically (vectorised over many independent trials) ----------------------


def _sample_iterations(sampler, p_rows, q_rows, trials, seed):
    """Run ``trials`` independent iterations; return (num_accepted, emitted [trials, K+1])."""
    gen = torch.Generator().manual_seed(seed)
    depth = q_rows.shape[0]
    drafts = torch.multinomial(q_rows, trials, replacement=True, generator=gen).T  # [trials, K]
    result = sampler(
        drafts, q_rows.expand(trials, *q_rows.shape), p_rows.expand(trials, *p_rows.shape), gen
    )
    emitted = torch.cat([drafts, torch.zeros(trials, 1, dtype=torch.long)], dim=1)
    emitted[torch.arange(trials), result.num_accepted] = result.next_token
    assert depth == drafts.shape[1]
    return result.num_accepted, emitted


def _positionwise_p_values(sampler, p_rows, q_rows, trials, seed):
    """For each position j: chi-square of emitted token j+1 given that it exists (a >= j) vs p[j].

    With context-free rows, the token at position j, given that the iteration
    reaches it, is distributed as p[j] (an accepted proposal or the correction
    at j, or the bonus at K).
    """
    accepted, emitted = _sample_iterations(sampler, p_rows, q_rows, trials, seed)
    values = []
    for j in range(p_rows.shape[0]):
        reached = accepted >= j
        counts = torch.bincount(emitted[reached, j], minlength=p_rows.shape[1])
        values.append(chi_square_p_value(counts, p_rows[j]))
    return values


def _rows(depth, vocab, seed):
    gen = torch.Generator().manual_seed(seed)
    p = _random_dist(depth + 1, vocab, gen=gen)
    q = _random_dist(depth, vocab, gen=gen)
    # Position 0 is a hand-made hard case: the draft overrates p's favourite.
    p[0] = torch.tensor([0.4, 0.3, 0.15, 0.1, 0.05])
    q[0] = torch.tensor([0.7, 0.1, 0.1, 0.05, 0.05])
    return p, q


@pytest.mark.parametrize("depth", [1, 3])
def test_sampled_tokens_follow_target_at_every_position(depth):
    p, q = _rows(depth, vocab=5, seed=depth)
    p_values = _positionwise_p_values(rejection_sample, p, q, trials=40_000, seed=10 + depth)
    assert min(p_values) > ALPHA, p_values


@pytest.mark.parametrize(
    "sampler",
    [biased_rejection_sampler(accept_argmax=True), biased_rejection_sampler(correct_from_p=True)],
    ids=["accepts-target-argmax", "corrects-from-p"],
)
def test_biased_samplers_fail_the_same_test(sampler):
    p, q = _rows(3, vocab=5, seed=3)
    p_values = _positionwise_p_values(sampler, p, q, trials=40_000, seed=13)
    assert min(p_values) < ALPHA, p_values


def test_bonus_token_is_drawn_from_last_target_row_when_all_accepted():
    gen = torch.Generator().manual_seed(5)
    depth, vocab, trials = 2, 5, 20_000
    p = _random_dist(depth + 1, vocab, gen=gen)
    q = p[:depth].clone()  # q == p: every proposal survives
    accepted, emitted = _sample_iterations(rejection_sample, p, q, trials, seed=6)
    assert (accepted == depth).all()
    counts = torch.bincount(emitted[:, depth], minlength=vocab)
    assert chi_square_p_value(counts, p[depth]) > ALPHA


def test_depth_zero_draws_from_first_target_row():
    gen = torch.Generator().manual_seed(8)
    p = _random_dist(1, 4, gen=gen)
    trials = 20_000
    result = rejection_sample(
        torch.empty(trials, 0, dtype=torch.long),
        torch.empty(trials, 0, 4, dtype=torch.float64),
        p.expand(trials, 1, 4),
        gen,
    )
    assert (result.num_accepted == 0).all()
    assert chi_square_p_value(torch.bincount(result.next_token, minlength=4), p[0]) > ALPHA


def test_seeded_generator_reproduces_and_different_seeds_differ():
    gen = torch.Generator().manual_seed(1)
    p = _random_dist(4, 6, gen=gen)
    q = _random_dist(3, 6, gen=gen)
    drafts = torch.multinomial(q, 200, replacement=True, generator=gen).T
    args = (drafts, q.expand(200, 3, 6), p.expand(200, 4, 6))

    def run(seed):
        out = rejection_sample(*args, generator=torch.Generator().manual_seed(seed))
        return out.num_accepted, out.next_token

    first, again, other = run(7), run(7), run(8)
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(first, other, strict=True))


def test_rejection_sample_rejects_mismatched_draft_probs():
    with pytest.raises(ValueError, match="draft_probs must have shape"):
        rejection_sample(torch.zeros(2, dtype=torch.long), torch.zeros(3, 5), torch.zeros(3, 5))
