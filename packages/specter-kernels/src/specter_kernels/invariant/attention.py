"""Batch-invariant scaled-dot-product attention, composed of invariant pieces.

Flash/efficient SDPA kernels tile the query rows and (for decode) split the
keys across programs by the problem size, so one query row's output depends on
how many rows came with it. Here attention is::

    scores = invariant_bmm(q, k^T) in fp32  ->  * scale + mask
    probs  = softmax over keys (invariant row sums, fp32)  ->  cast to v's dtype
    out    = invariant_bmm(probs, v)

which is slower than flash attention (the ``[T, L]`` scores are materialised)
but gives each query row the same bits for any T. Grouped-query attention
folds the query heads that share a kv head into the row dim
(``[B*Hk, g*T, D]``), so keys and values are never copied.
"""

from __future__ import annotations

import math

import torch

from specter_kernels.invariant.matmul import invariant_bmm
from specter_kernels.invariant.reductions import _softmax


def _check_attention(q, k, v, enable_gqa: bool) -> tuple[int, int, int, int, int, int]:
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        if not isinstance(tensor, torch.Tensor) or tensor.dim() != 4:
            raise ValueError(
                f"{name} must be a 4-d tensor [B, H, len, D], "
                f"got {getattr(tensor, 'shape', tensor)}"
            )
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    B, Hq, T, D = q.shape
    Bk, Hk, L, Dk = k.shape
    if Bk != B or tuple(v.shape[:3]) != (B, Hk, L) or Dk != D:
        raise ValueError(
            f"shapes do not fit: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}; "
            f"expected q [B, Hq, T, D], k [B, Hk, L, D], v [B, Hk, L, Dv]"
        )
    if Hq != Hk and (not enable_gqa or Hq % Hk):
        raise ValueError(
            f"q has {Hq} heads and k/v {Hk}: pass enable_gqa=True with Hq a multiple of Hk"
        )
    return B, Hq, Hk, T, L, D


def invariant_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """Batch-invariant ``F.scaled_dot_product_attention`` (no dropout).

    Args:
        q: ``[B, Hq, T, D]``.
        k: ``[B, Hk, L, D]``.
        v: ``[B, Hk, L, Dv]`` (Dv may differ from D).
        attn_mask: bool (True = attend) or additive float, broadcastable to ``[B, Hq, T, L]``.
        is_causal: key j visible to query i iff ``j <= i`` (top-left aligned, as SDPA).
        scale: score scale, default ``1 / sqrt(D)``.
        enable_gqa: allow ``Hq`` a multiple of ``Hk`` (query head h uses kv head ``h // (Hq/Hk)``).

    Returns:
        ``[B, Hq, T, Dv]`` in ``q``'s dtype. A query row with every key masked
        gets zeros (SDPA's math backend does the same; flash backends may
        return NaN).

    Raises:
        ValueError: bad shapes, or ``attn_mask`` together with ``is_causal``.
        TypeError: mismatched dtypes.
    """
    B, Hq, Hk, T, L, D = _check_attention(q, k, v, enable_gqa)
    if attn_mask is not None and is_causal:
        raise ValueError("pass either attn_mask or is_causal=True, not both (as SDPA)")
    g = Hq // Hk
    Dv = v.shape[3]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    queries = q.reshape(B * Hk, g * T, D)  # heads sharing a kv head become extra rows
    scores = invariant_bmm(
        queries, k.reshape(B * Hk, L, D).transpose(1, 2), out_dtype=torch.float32
    )
    scores = scores.view(B, Hk, g, T, L) * scale
    if is_causal:
        visible = torch.ones(T, L, dtype=torch.bool, device=q.device).tril()
        attn_mask = visible
    if attn_mask is not None:
        try:
            mask = attn_mask.broadcast_to(B, Hq, T, L)
        except RuntimeError as error:
            raise ValueError(
                f"attn_mask {tuple(attn_mask.shape)} does not broadcast to [B, Hq, T, L] = "
                f"{(B, Hq, T, L)}"
            ) from error
        mask = mask.reshape(B, Hk, g, T, L)
        if mask.dtype == torch.bool:
            scores = scores.masked_fill(~mask, float("-inf"))
        else:
            scores = scores + mask.float()
    probs = _softmax(scores, -1, None, log=False, zero_masked_rows=True)
    probs = probs.to(v.dtype).view(B * Hk, g * T, L)
    out = invariant_bmm(probs, v.reshape(B * Hk, L, Dv))
    return out.view(B, Hq, T, Dv)
