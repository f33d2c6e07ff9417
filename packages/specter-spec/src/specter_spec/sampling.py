"""Sampling configuration and the filtered next-token distribution.

The same :func:`sampling_probs` turns both the draft's logits (into ``q``) and
the target's logits (into ``p``): temperature, top-k and top-p are applied to
both identically, so speculative sampling reproduces the target's *filtered*
distribution exactly, which is what target-only sampling with the same
settings draws from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["NonFiniteLogitsError", "SamplingConfig", "check_finite_logits", "sampling_probs"]


class NonFiniteLogitsError(RuntimeError):
    """A model returned NaN or infinite logits: its weights (or its kernels) are broken."""


def check_finite_logits(logits: torch.Tensor, role: str) -> None:
    """Raise :class:`NonFiniteLogitsError` where ``logits`` hold a NaN or an infinity.

    One host read: call it once a generation or on an error path, never per token.
    """
    if not bool(torch.isfinite(logits).all()):
        raise NonFiniteLogitsError(
            f"the {role} model's logits are not finite (NaN or infinity): its weights are "
            "probably corrupt; check the checkpoint's files (sizes, checksums; download them "
            "again)."
        )


@dataclass(frozen=True)
class SamplingConfig:
    """How the next token is chosen from logits.

    ``temperature == 0`` means greedy decoding (argmax); top-k and top-p are then
    ignored. Otherwise logits are divided by the temperature, then filtered by
    top-k, then by top-p, then normalised with a softmax.

    Attributes:
        temperature: 0 for greedy, otherwise a positive divisor of the logits.
        top_p: nucleus mass in (0, 1]; 1 keeps every token. The smallest set of
            most likely tokens whose mass reaches ``top_p`` is kept.
        top_k: keep the ``top_k`` most likely tokens (ties with the k-th are
            kept too); 0 keeps every token.
        seed: seeds a fresh ``torch.Generator`` at the start of every
            ``generate`` call, so equal seeds give equal outputs; ``None`` uses
            torch's global generator.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    def __post_init__(self) -> None:
        if (
            isinstance(self.temperature, bool)
            or not isinstance(self.temperature, int | float)
            or not math.isfinite(self.temperature)
            or self.temperature < 0
        ):
            raise ValueError(
                f"SamplingConfig.temperature must be a finite number >= 0 (0 = greedy), "
                f"got {self.temperature!r}."
            )
        if (
            isinstance(self.top_p, bool)
            or not isinstance(self.top_p, int | float)
            or not 0 < self.top_p <= 1
        ):
            raise ValueError(
                f"SamplingConfig.top_p must be in (0, 1] (1 disables nucleus filtering), "
                f"got {self.top_p!r}."
            )
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(
                f"SamplingConfig.top_k must be an int >= 0 (0 disables top-k), got {self.top_k!r}."
            )
        if self.seed is not None and (
            isinstance(self.seed, bool) or not isinstance(self.seed, int)
        ):
            raise TypeError(f"SamplingConfig.seed must be an int or None, got {self.seed!r}.")

    @classmethod
    def greedy(cls) -> SamplingConfig:
        """Greedy decoding: always the argmax token."""
        return cls(temperature=0.0)

    @property
    def is_greedy(self) -> bool:
        """True when tokens are chosen by argmax (``temperature == 0``)."""
        return self.temperature == 0

    def make_generator(self, device: torch.device) -> torch.Generator | None:
        """A generator seeded with ``seed`` on ``device``, or ``None`` when unseeded."""
        if self.seed is None:
            return None
        return torch.Generator(device=device).manual_seed(self.seed)


def sampling_probs(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """The filtered next-token distribution for sampled decoding.

    Computed in at least float32 so that half-precision logits do not make
    probabilities that fail to sum to one.

    Args:
        logits: ``[..., V]`` raw next-token logits.
        config: a sampled (non-greedy) configuration.

    Returns:
        ``[..., V]`` probabilities (rows sum to 1), zero outside the kept set.

    Raises:
        ValueError: if ``config`` is greedy (there is no distribution to sample).
    """
    if config.is_greedy:
        raise ValueError(
            "sampling_probs needs a sampled configuration (temperature > 0); "
            "greedy decoding uses the argmax of the logits instead."
        )
    dtype = torch.promote_types(logits.dtype, torch.float32)
    scores = logits.to(dtype) / config.temperature
    vocab = scores.shape[-1]
    if 0 < config.top_k < vocab:
        kth_largest = torch.topk(scores, config.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth_largest, -math.inf)
    if config.top_p < 1:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        sorted_probs = torch.softmax(sorted_scores, dim=-1)
        # Mass strictly before each token: a token is dropped once the more
        # likely tokens alone already reach top_p. The most likely one always stays.
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop_sorted = mass_before >= config.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, -math.inf)
    return torch.softmax(scores, dim=-1)
