"""SpecController with sampling: the joint law of the first tokens is the target's."""

import itertools
import math

import pytest
import torch

import specter_spec.controller
from spec_fakes import (
    TableLM,
    biased_rejection_sampler,
    chi_square_p_value,
    fake_quantized,
    random_table,
    tiny_causal_lm,
)
from specter_spec import HFCausalLM, SamplingConfig, SpecController, sampling_probs

ALPHA = 0.001
VOCAB = 4
PROMPT = [0, 1]
CONFIGS = {
    "temperature-1": SamplingConfig(temperature=1.0),
    "filtered": SamplingConfig(temperature=0.8, top_k=3, top_p=0.9),
}


def _models():
    # A flat-ish target keeps every cell of the joint law likely enough to test
    # with few samples; a sharper, perturbed draft overrates the target's
    # favourites, so proposals are often rejected and both biases show.
    target = TableLM(random_table(VOCAB, period=3, seed=11, scale=0.6))
    draft = TableLM(target.table * 3 + random_table(VOCAB, period=3, seed=12, scale=0.5))
    return draft, target


def _target_joint_law(target, config, length=3):
    """Exact ``[V] * length`` law of the first ``length`` tokens of target-only sampling."""
    law = torch.zeros((VOCAB,) * length, dtype=torch.float64)
    for tokens in itertools.product(range(VOCAB), repeat=length):
        prob, context = 1.0, list(PROMPT)
        for token in tokens:
            logits = target.logits_at(context[-1], len(context) - 1)
            prob *= float(sampling_probs(logits, config)[token])
            context.append(token)
        law[tokens] = prob
    return law


def _sampled_counts(controller, trials, seed, length=3):
    counts = torch.zeros((VOCAB,) * length, dtype=torch.long)
    generator = torch.Generator().manual_seed(seed)
    for _ in range(trials):
        tokens = controller.generate(PROMPT, length, generator=generator).tokens
        counts[tuple(tokens)] += 1
    return counts


def _trials_for(law):
    # Enough samples that every possible cell expects at least 5 hits.
    return max(2000, math.ceil(5.5 / float(law[law > 0].min())))


@pytest.mark.parametrize("config_name", list(CONFIGS))
@pytest.mark.parametrize("depth", [2, 3])
def test_joint_law_of_first_three_tokens_is_the_targets(config_name, depth):
    config = CONFIGS[config_name]
    draft, target = _models()
    law = _target_joint_law(target, config)
    controller = SpecController(draft, target, depth=depth, sampling=config)
    counts = _sampled_counts(controller, _trials_for(law), seed=depth)
    assert chi_square_p_value(counts, law) > ALPHA
    if config_name == "filtered":
        assert (law == 0).any()  # top-k/top-p removed tokens, and none was sampled


@pytest.mark.parametrize(
    "sampler",
    [
        biased_rejection_sampler(accept_argmax=True),
        biased_rejection_sampler(correct_from_p=True),
    ],
    ids=["accepts-target-argmax", "corrects-from-p"],
)
def test_the_same_test_fails_for_a_biased_sampler(monkeypatch, sampler):
    monkeypatch.setattr(specter_spec.controller, "rejection_sample", sampler)
    config = CONFIGS["temperature-1"]
    draft, target = _models()
    law = _target_joint_law(target, config)
    controller = SpecController(draft, target, depth=2, sampling=config)
    counts = _sampled_counts(controller, _trials_for(law), seed=2)
    assert chi_square_p_value(counts, law) < ALPHA


def test_seed_reproduces_a_sampled_generation_and_other_seeds_differ():
    target = tiny_causal_lm(seed=4)
    draft = fake_quantized(target, bits=4)

    def run(seed):
        controller = SpecController(
            HFCausalLM(draft),
            HFCausalLM(target),
            depth=3,
            sampling=SamplingConfig(temperature=1.0, seed=seed),
        )
        return controller.generate([5, 9, 2], 20)

    first, again = run(7), run(7)
    assert first.tokens == again.tokens
    assert [it.accepted for it in first.stats.iterations] == [
        it.accepted for it in again.stats.iterations
    ]
    assert any(run(seed).tokens != first.tokens for seed in (8, 9, 10))
    assert first.stats.accepted > 0  # the tiny models agree often enough to accept
    assert all(0 <= t < 64 for t in first.tokens)
