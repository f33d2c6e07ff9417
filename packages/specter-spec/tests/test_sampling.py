"""SamplingConfig validation and the filtered distribution (temperature, top-k, top-p)."""

import itertools

import pytest
import torch

from specter_spec.sampling import SamplingConfig, sampling_probs


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"temperature": -0.5}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
    ],
)
def test_bad_settings_are_refused_with_the_bad_value(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingConfig(**kwargs)


def test_non_integer_seed_is_refused():
    with pytest.raises(TypeError, match="seed"):
        SamplingConfig(seed=1.5)


def test_greedy_config_is_temperature_zero_and_has_no_distribution():
    assert SamplingConfig.greedy().is_greedy
    assert SamplingConfig(temperature=0).is_greedy
    assert not SamplingConfig(temperature=0.7).is_greedy
    with pytest.raises(ValueError, match="greedy"):
        sampling_probs(torch.zeros(4), SamplingConfig.greedy())


def test_temperature_divides_logits():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 9, generator=gen)
    probs = sampling_probs(logits, SamplingConfig(temperature=0.5))
    torch.testing.assert_close(probs, torch.softmax(logits * 2, -1))


def _brute_force(logits: torch.Tensor, temperature: float, top_k: int, top_p: float):
    """Reference filter for one row, written from the definitions."""
    scores = (logits / temperature).tolist()
    keep = set(range(len(scores)))
    if 0 < top_k < len(scores):
        kth = sorted(scores, reverse=True)[top_k - 1]
        keep = {i for i in keep if scores[i] >= kth}
    probs = torch.softmax(
        torch.tensor(
            [scores[i] if i in keep else -1e30 for i in range(len(scores))], dtype=torch.float64
        ),
        -1,
    )
    if top_p < 1:
        order = sorted(keep, key=lambda i: -scores[i])
        mass, nucleus = 0.0, set()
        for i in order:  # smallest prefix of most likely tokens reaching top_p
            nucleus.add(i)
            mass += float(probs[i])
            if mass >= top_p:
                break
        keep = nucleus
    kept = torch.tensor(
        [scores[i] if i in keep else float("-inf") for i in range(len(scores))], dtype=torch.float64
    )
    return torch.softmax(kept, -1)


@pytest.mark.parametrize(
    ("temperature", "top_k", "top_p"),
    list(itertools.product([0.6, 1.0], [0, 1, 3, 8], [1.0, 0.9, 0.5, 0.05])),
)
def test_filter_matches_definition(temperature, top_k, top_p):
    gen = torch.Generator().manual_seed(top_k * 100 + int(top_p * 10))
    logits = torch.randn(5, 8, generator=gen, dtype=torch.float64) * 2
    config = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    probs = sampling_probs(logits, config)
    for row in range(logits.shape[0]):
        torch.testing.assert_close(probs[row], _brute_force(logits[row], temperature, top_k, top_p))
    torch.testing.assert_close(probs.sum(-1), torch.ones(5, dtype=torch.float64))


def test_top_k_keeps_ties_with_the_kth_token():
    probs = sampling_probs(torch.tensor([3.0, 1.0, 1.0, 0.0]), SamplingConfig(top_k=2))
    assert (probs[:3] > 0).all()
    assert probs[3] == 0


def test_half_precision_logits_give_float32_probabilities():
    probs = sampling_probs(torch.randn(2, 50).half(), SamplingConfig(top_p=0.8))
    assert probs.dtype == torch.float32
    torch.testing.assert_close(probs.sum(-1), torch.ones(2))


def test_seed_makes_a_fresh_generator_each_time():
    config = SamplingConfig(seed=4)
    first = torch.rand(3, generator=config.make_generator(torch.device("cpu")))
    again = torch.rand(3, generator=config.make_generator(torch.device("cpu")))
    assert torch.equal(first, again)
    assert SamplingConfig().make_generator(torch.device("cpu")) is None
