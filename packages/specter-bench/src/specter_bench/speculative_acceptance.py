"""Expected acceptance of speculative sampling, from the draft's and the target's logits.

Speculative sampling (Leviathan et al. 2023, Chen et al. 2023) accepts a token ``x`` that the
draft sampled from ``q`` with probability ``min(1, p(x) / q(x))``, ``p`` being the target's
distribution at the same position. Averaged over the draft's sample, the chance that a
proposal is accepted is

    sum_x q(x) min(1, p(x) / q(x)) = sum_x min(p(x), q(x)) = 1 - TV(p, q),

one minus the total-variation distance of the two distributions. It is 1 when the draft is
the target and 0 when their supports are disjoint. Greedy agreement (the two argmaxes equal)
is the temperature-0 limit; this is the sampled counterpart, at any temperature > 0.

The vocabulary can be large (102,400 for DeepSeek-V2-Lite), so the probabilities are formed
a block of rows at a time, in float32, on the logits' device; only ``[T]`` values come back.
"""

from __future__ import annotations

import math

import torch

__all__ = ["DEFAULT_ROW_BLOCK", "acceptance_key", "sampled_acceptance"]

DEFAULT_ROW_BLOCK = 256
"""Positions whose probabilities are held at once (256 x 102,400 x 4 bytes = 105 MB each)."""


def sampled_acceptance(
    target_logits: torch.Tensor,
    draft_logits: torch.Tensor,
    temperature: float = 1.0,
    *,
    row_block: int = DEFAULT_ROW_BLOCK,
) -> torch.Tensor:
    """Per-position acceptance probability ``sum_x min(p(x), q(x))`` of speculative sampling.

    ``p = softmax(target_logits / temperature)``, ``q = softmax(draft_logits / temperature)``,
    both in float32 whatever the logits' dtype.

    Args:
        target_logits: ``[T, V]`` the target's next-token logits at T positions.
        draft_logits: ``[T, V]`` the draft's logits at the same positions.
        temperature: sampling temperature (> 0; 1 samples the model's own distribution).
        row_block: positions processed at once (bounds the float32 temporaries).

    Returns:
        ``[T]`` float32 on the logits' device, each in ``[0, 1]``.

    Raises:
        TypeError: logits that are not floating-point tensors.
        ValueError: shapes that differ or are not ``[T, V]``, logits on different devices,
            a temperature that is not a finite number > 0, or ``row_block`` < 1.

    Example:
        >>> p = torch.tensor([[0.0, 0.0]])  # uniform over two tokens
        >>> q = torch.tensor([[math.log(3.0), 0.0]])  # 3/4, 1/4
        >>> sampled_acceptance(p, q).tolist()  # min(1/2, 3/4) + min(1/2, 1/4)
        [0.75]
    """
    for name, logits in (("target_logits", target_logits), ("draft_logits", draft_logits)):
        if not isinstance(logits, torch.Tensor) or not logits.dtype.is_floating_point:
            raise TypeError(
                f"{name} must be a floating-point [T, V] tensor of logits, got "
                f"{type(logits).__name__}"
                + (f" of {logits.dtype}" if isinstance(logits, torch.Tensor) else "")
                + "."
            )
    if target_logits.dim() != 2 or target_logits.shape != draft_logits.shape:
        raise ValueError(
            f"target_logits {tuple(target_logits.shape)} and draft_logits "
            f"{tuple(draft_logits.shape)} must both be [T, V] with the same T and vocabulary V."
        )
    if target_logits.device != draft_logits.device:
        raise ValueError(
            f"target_logits are on {target_logits.device} and draft_logits on "
            f"{draft_logits.device}; move both to one device."
        )
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, int | float)
        or not math.isfinite(temperature)
        or temperature <= 0
    ):
        raise ValueError(
            f"temperature must be a finite number > 0, got {temperature!r} (greedy decoding is "
            "measured by the argmax agreement instead)."
        )
    if isinstance(row_block, bool) or not isinstance(row_block, int) or row_block < 1:
        raise ValueError(f"row_block must be an int >= 1, got {row_block!r}.")
    rows = target_logits.shape[0]
    out = torch.empty(rows, dtype=torch.float32, device=target_logits.device)
    for begin in range(0, rows, row_block):
        end = min(begin + row_block, rows)
        p = torch.softmax(target_logits[begin:end].float() / temperature, dim=-1)
        q = torch.softmax(draft_logits[begin:end].float() / temperature, dim=-1)
        # Rounding can push a sum of V minima a few ulps past 1 for identical inputs.
        out[begin:end] = torch.minimum(p, q).sum(-1).clamp_(0.0, 1.0)
    return out


def acceptance_key(temperature: float) -> str:
    """The record field of the mean acceptance at ``temperature``.

    ``sampled_acceptance`` at 1 (the model's own distribution), else
    ``sampled_acceptance_t<temperature>`` (e.g. ``sampled_acceptance_t0.7``).
    """
    return "sampled_acceptance" if temperature == 1 else f"sampled_acceptance_t{temperature:g}"
