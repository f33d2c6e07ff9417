"""Plain-torch routed-expert arithmetic in any dtype (the path for non-fp16 models).

The fused kernels of specter-kernels take fp16 activations. Models run in float32 or
float64 (CPU tests, where near-tie argmaxes must not flip) use these functions instead. They
follow transformers' eager experts loop operation for operation (``linear`` to gate_up,
SiLU(gate) * up, ``linear`` to down, times the routing weight, ``index_add_``), so a float64
model reproduces transformers' float64 logits to rounding. They read expert ids back to the
host (``torch.where``): a reference path, not a decode hot path.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
import torch.nn.functional as F


def expert_mlp(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """One SiLU-gated expert: ``down(silu(gate x) * up x)``.

    Args:
        x: ``[T, H]``.
        gate_up: ``[2I, H]``, gate rows first.
        down: ``[H, I]``.

    Returns:
        ``[T, H]``.
    """
    gate, up = F.linear(x, gate_up).chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, down)


def accumulate_experts(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    experts: Iterable[tuple[int, torch.Tensor, torch.Tensor]],
    out: torch.Tensor,
) -> torch.Tensor:
    """Add the routing-weighted outputs of the given experts into ``out``.

    Args:
        x: ``[T, H]`` hidden states.
        topk_ids: ``[T, k]`` routed expert ids.
        topk_weights: ``[T, k]`` routing weights.
        experts: ``(expert id, gate_up [2I, H], down [H, I])`` for each expert to compute;
            tokens not routed to it are untouched.
        out: ``[T, H]`` accumulator, updated in place (its dtype is the sum's).

    Returns:
        ``out``.
    """
    for tokens, _, y in _routed_outputs(x, topk_ids, topk_weights, experts):
        out.index_add_(0, tokens, y.to(out.dtype))
    return out


def write_expert_pairs(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    experts: Iterable[tuple[int, torch.Tensor, torch.Tensor]],
    out: torch.Tensor,
) -> torch.Tensor:
    """Write each routed pair's weighted expert output into its own row of ``out``.

    The batch-invariant counterpart of :func:`accumulate_experts`: nothing is summed here,
    so the result cannot depend on which experts share a wave; the caller sums the ``k``
    pairs of each row in a fixed order (``specter_kernels.sum_routed_pairs``).

    Args:
        x: ``[T, H]`` hidden states.
        topk_ids: ``[T, k]`` routed expert ids.
        topk_weights: ``[T, k]`` routing weights.
        experts: ``(expert id, gate_up [2I, H], down [H, I])`` for each expert to compute.
        out: ``[T, k, H]``; pair ``(t, j)`` is written where ``topk_ids[t, j]`` is computed.

    Returns:
        ``out``.
    """
    for tokens, slots, y in _routed_outputs(x, topk_ids, topk_weights, experts):
        out[tokens, slots] = y.to(out.dtype)
    return out


def _routed_outputs(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    experts: Iterable[tuple[int, torch.Tensor, torch.Tensor]],
) -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """``(tokens [n], top-k slots [n], weighted outputs [n, H])`` of each expert's routed
    pairs, for experts that some token chose."""
    for expert, gate_up, down in experts:
        tokens, slots = torch.where(topk_ids == expert)
        if tokens.numel() == 0:
            continue
        yield (
            tokens,
            slots,
            expert_mlp(x[tokens], gate_up, down) * topk_weights[tokens, slots, None],
        )
