"""The draft's routed experts without the fused kernel: one W4A16 call per used expert.

The ablation ``specter-unfused-draft`` runs Specter with this in place of
``specter_kernels.fused_moe_w4a16`` inside specter-models' draft experts, to measure what
the single fused launch saves. It reads the used experts on the host (a sync per layer) and
launches each expert separately, as an unfused implementation does. That sync cannot be
recorded in a CUDA graph, so the draft's step graphs are paused meanwhile (a replayed
graph would run the fused kernel it was captured with).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from specter_kernels import Int4Weight, fused_moe_w4a16

__all__ = ["per_expert_w4a16", "unfused_draft_kernel"]


def per_expert_w4a16(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: Int4Weight,
    w2: Int4Weight,
    **_: object,
) -> torch.Tensor:
    """``fused_moe_w4a16``'s result computed one expert at a time.

    Args:
        x: fp16 ``[T, H]``.
        topk_ids: ``[T, k]`` expert ids.
        topk_weights: ``[T, k]`` routing weights.
        w13: INT4 gate_up ``[E, 2I, H]``.
        w2: INT4 down ``[E, H, I]``.

    Returns:
        fp16 ``[T, H]``.
    """
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    # Unfused on purpose: the expert list is read on the host, one launch per expert.
    for e in torch.unique(topk_ids).tolist():
        tokens, slots = torch.nonzero(topk_ids == e, as_tuple=True)
        one = torch.zeros(tokens.numel(), 1, dtype=topk_ids.dtype, device=x.device)
        weights = topk_weights[tokens, slots, None]
        y = fused_moe_w4a16(x[tokens], one, weights, w13.experts(e), w2.experts(e))
        out.index_add_(0, tokens, y.float())
    return out.to(x.dtype)


@contextmanager
def unfused_draft_kernel(draft: object | None = None) -> Iterator[None]:
    """Inside the block, specter-models' draft experts use :func:`per_expert_w4a16`.

    specter-models calls ``fused_moe_w4a16`` through its ``specter_experts`` module's
    namespace; this swaps that one name and restores it on exit.

    Args:
        draft: the draft adapter whose step graphs are paused for the block
            (specter-models' ``graphs_paused``), or None.

    Raises:
        RuntimeError: specter-models no longer calls the kernel by that name (the ablation
            would silently measure the fused kernel).
    """
    from specter_models import specter_experts

    if getattr(specter_experts, "fused_moe_w4a16", None) is not fused_moe_w4a16:
        raise RuntimeError(
            "specter_models.specter_experts does not call specter_kernels.fused_moe_w4a16 by "
            "that name; the unfused-draft ablation cannot replace it."
        )
    paused = getattr(draft, "graphs_paused", contextlib.nullcontext)
    specter_experts.fused_moe_w4a16 = per_expert_w4a16
    try:
        with paused():
            yield
    finally:
        specter_experts.fused_moe_w4a16 = fused_moe_w4a16
