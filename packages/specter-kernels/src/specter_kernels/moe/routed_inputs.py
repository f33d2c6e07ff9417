"""Validation of the routed-token inputs every MoE kernel takes."""

from __future__ import annotations

import torch


def check_routed_inputs(
    x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor
) -> tuple[int, int]:
    """Check fp16 activations ``[T, H]`` and their routing ``[T, k]``; return ``(T, H)``.

    Raises:
        TypeError: ``x`` is not float16 2-D, or ``topk_ids`` is not int32/int64.
        ValueError: ``topk_ids`` or ``topk_weights`` do not match ``[T, k]``.
    """
    if x.dim() != 2 or x.dtype != torch.float16:
        raise TypeError(f"x must be float16 [T, H], got {x.dtype} {tuple(x.shape)}")
    T, H = x.shape
    if topk_ids.dim() != 2 or topk_ids.shape[0] != T:
        raise ValueError(f"topk_ids must be [T={T}, k], got {tuple(topk_ids.shape)}")
    if topk_ids.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"topk_ids must be int32 or int64, got {topk_ids.dtype}")
    if tuple(topk_weights.shape) != tuple(topk_ids.shape) or not topk_weights.is_floating_point():
        raise ValueError(
            f"topk_weights must be a float tensor shaped like topk_ids {tuple(topk_ids.shape)}, "
            f"got {topk_weights.dtype} {tuple(topk_weights.shape)}"
        )
    return T, H
