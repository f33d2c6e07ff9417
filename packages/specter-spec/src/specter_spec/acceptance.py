"""Greedy and exact sampled acceptance of draft proposals.

Terms, defined once for the whole package:

- **proposals** ``d[1..K]``: the K tokens the draft drafted in one iteration
  (K is the iteration's *depth*).
- **accepted**: the proposals kept by the acceptance rule. They always form a
  prefix ``d[1..a]``: the first rejected proposal and everything after it are
  discarded. **Accepted per iteration** is this ``a`` (``0 <= a <= K``); it
  never counts the correction or bonus token.
- **correction token**: when proposal ``a + 1`` is rejected (``a < K``), the
  token the target supplies in its place.
- **bonus token**: when all K proposals are accepted (``a == K``), the extra
  token the target supplies from its distribution after ``d[K]``. With K = 0
  every iteration ends with a bonus token: that is plain target decoding.

So an iteration commits ``a + 1`` tokens: the accepted proposals, then one
correction or bonus token (fewer only if a stop token or the token budget ends
generation inside them).

Rules:

- **Greedy**: ``a`` is the length of the longest prefix of proposals equal to
  the target's argmax at the same position; the correction or bonus token is
  the target's argmax at position ``a``. The output equals target-only greedy
  decoding token for token.
- **Sampled** (speculative sampling, Leviathan et al. 2023; Chen et al. 2023):
  proposal ``x`` drawn from the draft distribution ``q`` is accepted with
  probability ``min(1, p(x) / q(x))``; at the first rejection the correction
  token is drawn from the residual ``max(p - q, 0)`` normalised; the bonus
  token is drawn from ``p[K]``. Each committed token is then distributed
  exactly as ``p``: ``P(x) = min(p(x), q(x)) + (sum_y max(p(y) - q(y), 0)) *
  residual(x) = p(x)``. ``q(x) = 0`` is a rejection (never a NaN); when the
  residual has no mass (``p == q`` numerically, so a rejection has probability
  zero up to rounding) the correction is drawn from ``p``.

Every function here works on leading batch dimensions ``[...]`` so that many
independent trials run in one call (the controller uses none); nothing here
reads a tensor back to the host.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = [
    "AcceptanceResult",
    "acceptance_probability",
    "greedy_accept",
    "rejection_sample",
    "residual_distribution",
]


@dataclass(frozen=True)
class AcceptanceResult:
    """The outcome of verifying K proposals (terms as defined in :mod:`specter_spec.acceptance`).

    Attributes:
        num_accepted: ``[...]`` int64, the number of accepted proposals ``a``
            (accepted per iteration), ``0 <= a <= K``.
        next_token: ``[...]`` int64, the correction token when ``a < K``, the
            bonus token when ``a == K``.
    """

    num_accepted: torch.Tensor
    next_token: torch.Tensor


def _check_shapes(draft_tokens: torch.Tensor, target: torch.Tensor, name: str) -> None:
    depth = draft_tokens.shape[-1]
    if target.dim() != draft_tokens.dim() + 1 or target.shape[-2] != depth + 1:
        raise ValueError(
            f"{name} must have shape [..., K+1, V] for draft_tokens of shape [..., K]; "
            f"got {tuple(target.shape)} for draft_tokens {tuple(draft_tokens.shape)}."
        )
    if target.shape[:-2] != draft_tokens.shape[:-1]:
        raise ValueError(
            f"batch dimensions differ: {name} {tuple(target.shape[:-2])} vs "
            f"draft_tokens {tuple(draft_tokens.shape[:-1])}."
        )


def _accepted_prefix_length(accepted: torch.Tensor) -> torch.Tensor:
    """``[..., K]`` bool -> ``[...]`` int64 length of the leading run of True."""
    return torch.cumprod(accepted.long(), dim=-1).sum(dim=-1)


def greedy_accept(
    draft_tokens: torch.Tensor,
    target_logits: torch.Tensor,
    argmax: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> AcceptanceResult:
    """Greedy acceptance: longest prefix matching the target's argmax, then its token.

    Args:
        draft_tokens: ``[..., K]`` int64 proposals ``d[1..K]``.
        target_logits: ``[..., K+1, V]`` target logits; row ``i`` predicts the
            token after ``d[i]`` (row 0 follows the last committed token).
        argmax: the last dim's argmax with ``torch.argmax``'s result (first index of
            ties), for instance a model's faster kernel (``SpecModel``'s optional
            ``argmax``); default ``torch.argmax(..., dim=-1)``.

    Returns:
        The accepted count and the correction or bonus token (the target's
        argmax at row ``a``).

    Raises:
        ValueError: if the shapes do not match.
    """
    _check_shapes(draft_tokens, target_logits, "target_logits")
    target_tokens = (
        argmax(target_logits) if argmax is not None else target_logits.argmax(dim=-1)
    )  # [..., K+1]
    num_accepted = _accepted_prefix_length(draft_tokens == target_tokens[..., :-1])
    next_token = target_tokens.gather(-1, num_accepted.unsqueeze(-1)).squeeze(-1)
    return AcceptanceResult(num_accepted=num_accepted, next_token=next_token)


def acceptance_probability(
    target_probs: torch.Tensor, draft_probs: torch.Tensor, tokens: torch.Tensor
) -> torch.Tensor:
    """``min(1, p(x) / q(x))`` for proposals ``x``; 0 where ``q(x) == 0``.

    Args:
        target_probs: ``[..., V]`` target distribution ``p``.
        draft_probs: ``[..., V]`` draft distribution ``q``.
        tokens: ``[...]`` int64 proposals ``x``.

    Returns:
        ``[...]`` acceptance probabilities in [0, 1], never NaN.
    """
    p_x = target_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    q_x = draft_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    # A proposal the draft could not have drawn is rejected; dividing by a
    # placeholder 1 keeps 0/0 out of the graph entirely.
    drawable = q_x > 0
    ratio = p_x / torch.where(drawable, q_x, torch.ones_like(q_x))
    return torch.where(drawable, ratio.clamp(max=1.0), torch.zeros_like(ratio))


def residual_distribution(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """The correction distribution: ``max(p - q, 0)`` normalised, or ``p`` when it has no mass.

    Args:
        target_probs: ``[..., V]`` target distribution ``p``.
        draft_probs: ``[..., V]`` draft distribution ``q`` (all zeros gives ``p``).

    Returns:
        ``[..., V]`` a distribution (rows sum to 1).
    """
    residual = (target_probs - draft_probs).clamp(min=0)
    mass = residual.sum(dim=-1, keepdim=True)
    # Zero mass means p <= q everywhere, i.e. p == q up to rounding: a rejection
    # then has probability zero (up to rounding) and drawing from p is exact.
    has_mass = mass > 0
    normalised = residual / torch.where(has_mass, mass, torch.ones_like(mass))
    return torch.where(has_mass, normalised, target_probs)


def rejection_sample(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
) -> AcceptanceResult:
    """Exact sampled acceptance of K proposals, vectorised over K (and any batch dims).

    Draws one uniform per proposal, accepts the leading run of proposals with
    ``u < min(1, p(x)/q(x))``, then draws the correction token from the
    residual at the first rejection, or the bonus token from ``p[K]``. No host
    synchronisation happens here; the caller reads ``num_accepted`` back once.

    Args:
        draft_tokens: ``[..., K]`` int64 proposals, drawn from ``draft_probs``.
        draft_probs: ``[..., K, V]`` draft distributions ``q[1..K]``.
        target_probs: ``[..., K+1, V]`` target distributions ``p[0..K]``; row
            ``i`` is the target's distribution for the position of ``d[i+1]``,
            row ``K`` the one after ``d[K]``.
        generator: random source, for reproducible runs.

    Returns:
        The accepted count and the correction or bonus token.

    Raises:
        ValueError: if the shapes do not match.
    """
    _check_shapes(draft_tokens, target_probs, "target_probs")
    if draft_probs.shape != (*draft_tokens.shape, target_probs.shape[-1]):
        raise ValueError(
            f"draft_probs must have shape [..., K, V] = "
            f"{(*draft_tokens.shape, target_probs.shape[-1])}, got {tuple(draft_probs.shape)}."
        )
    depth = draft_tokens.shape[-1]
    accept_prob = acceptance_probability(target_probs[..., :depth, :], draft_probs, draft_tokens)
    uniform = torch.rand(
        accept_prob.shape, generator=generator, device=accept_prob.device, dtype=accept_prob.dtype
    )
    num_accepted = _accepted_prefix_length(uniform < accept_prob)  # [...]

    # A zero draft row after q[K] turns the residual at position K into p[K]:
    # the bonus and the correction come from one gather and one draw.
    padded_q = torch.cat([draft_probs, torch.zeros_like(target_probs[..., :1, :])], dim=-2)
    row = num_accepted[..., None, None].expand(*num_accepted.shape, 1, target_probs.shape[-1])
    p_row = target_probs.gather(-2, row).squeeze(-2)
    q_row = padded_q.gather(-2, row).squeeze(-2)
    next_dist = residual_distribution(p_row, q_row)  # [..., V]
    flat = next_dist.reshape(-1, next_dist.shape[-1])
    next_token = torch.multinomial(flat, 1, generator=generator).reshape(num_accepted.shape)
    return AcceptanceResult(num_accepted=num_accepted, next_token=next_token)
