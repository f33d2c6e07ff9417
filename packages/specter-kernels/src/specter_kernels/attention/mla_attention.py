"""Multi-head latent attention (DeepSeek-V2's MLA) over the compressed KV cache, absorbed.

DeepSeek-V2 caches one ``R = kv_lora_rank``-wide latent ``c`` (normed) and one shared
``P = qk_rope_head_dim``-wide rotary key ``k_pe`` per position. transformers' attention
expands the whole cache through ``kv_b_proj`` at every step (``[L, R] -> [L, H, 256]``),
builds the keys by concatenation and runs SDPA over them: at batch size one that is a GEMM
over every cached row, two copies of the ``[H, L, 192]`` keys and the attention itself. The
absorbed form (the MLA paper's inference form) moves the up-projections to the query and
output side instead::

    q_lat[h]  = q_nope[h] @ W_UK[h]                      [T, R]   (a per-head GEMM, outside)
    score[h]  = (q_lat[h] @ c^T + q_pe[h] @ k_pe^T) * scale   [T, L]
    o_lat[h]  = softmax(score[h] + mask) @ c             [T, R]   (this module)
    out[h]    = o_lat[h] @ W_UV[h]^T                     [T, 128] (a per-head GEMM, outside)

so attention reads ``c`` and ``k_pe`` once, ``R + P`` values per position for all heads.

:func:`mla_attention` is the middle line, as flash-decoding on Triton: the keys are cut in
fixed ``SPLIT``-position chunks (absolute positions, whatever ``L`` is); one program per
(query row, chunk) runs an online softmax over its chunk for every head at once, and a
second kernel merges the chunks of a row in chunk order. Nothing a row computes depends on
the other rows or on how many rows were sent, and chunks past a row's last visible key add
exact zeros, so the result is batch-invariant by construction (the speculative target's
requirement) even when a longer window comes with more rows.
"""

from __future__ import annotations

import torch

from specter_kernels.backend import select_backend

HALF_DTYPES = (torch.float16, torch.bfloat16)


def mla_attention_reference(
    q_lat: torch.Tensor,
    q_pe: torch.Tensor,
    c_kv: torch.Tensor,
    k_pe: torch.Tensor,
    scale: float,
    mask: torch.Tensor | None = None,
    w_uv: torch.Tensor | None = None,
) -> torch.Tensor:
    """``softmax((q_lat c^T + q_pe k_pe^T) * scale + mask) @ c`` in plain torch, then
    ``@ W_UV^T`` per head when ``w_uv`` is given.

    Half-precision inputs: scores and softmax in fp32, the probabilities rounded to the
    input dtype before the product with ``c`` (as flash attention and SDPA's math path),
    fp32 sums. fp32/fp64 inputs: their own precision throughout.

    Args:
        q_lat: ``[H, T, R]`` absorbed no-position queries.
        q_pe: ``[H, T, P]`` rotary queries.
        c_kv: ``[L, R]`` cached latents.
        k_pe: ``[L, P]`` cached rotary keys.
        scale: multiplies the scores.
        mask: None (causal, bottom-right: row ``i`` sees keys ``j <= i + L - T``), bool
            ``[T, L]`` (True = attend) or additive float ``[T, L]``.
        w_uv: None, or ``W_UV [H, V, R]``: the result is then ``o_lat`` (rounded to its
            dtype) times ``W_UV[h]^T`` per head, in fp32 for half inputs, rounded once.

    Returns:
        ``o_lat [H, T, R]`` in ``q_lat``'s dtype (a row with no visible key gets zeros), or
        with ``w_uv`` the projected ``out [T, H, V]`` (the layout ``o_proj`` reads).
    """
    T, L = q_lat.shape[1], c_kv.shape[0]
    work = torch.float32 if q_lat.dtype in HALF_DTYPES else q_lat.dtype
    scores = q_lat.to(work) @ c_kv.to(work).T + q_pe.to(work) @ k_pe.to(work).T
    scores = scores * scale
    visible = _visible(mask, T, L, q_lat.device)
    if mask is not None and mask.dtype != torch.bool:
        scores = scores + mask.to(work)
    scores = scores.masked_fill(~visible, float("-inf"))
    peak = scores.amax(-1, keepdim=True).clamp_min(torch.finfo(work).min)
    e = torch.exp(scores - peak)
    probs = e / e.sum(-1, keepdim=True).clamp_min(torch.finfo(work).tiny)
    if q_lat.dtype in HALF_DTYPES:
        probs = probs.to(c_kv.dtype).to(work)
    o_lat = (probs @ c_kv.to(work)).to(q_lat.dtype)
    if w_uv is None:
        return o_lat
    out = o_lat.to(work) @ w_uv.to(work).transpose(1, 2)  # [H, T, V]
    return out.transpose(0, 1).contiguous().to(q_lat.dtype)


def mla_attention(
    q_lat: torch.Tensor,
    q_pe: torch.Tensor,
    c_kv: torch.Tensor,
    k_pe: torch.Tensor,
    scale: float,
    mask: torch.Tensor | None = None,
    w_uv: torch.Tensor | None = None,
) -> torch.Tensor:
    """Absorbed MLA attention (Triton on CUDA, the reference elsewhere); see the module
    docstring and ``mla_attention_reference`` for the arithmetic.

    With ``w_uv`` the value up-projection runs inside the kernel that merges the key chunks:
    each (row, head, ``V`` block) program merges its head's chunks, rounds ``o_lat`` to the
    dtype and takes its fixed-order fp32 dot products with ``W_UV``'s rows, so the two
    kernels and the ``[H, T, R]`` round trip of a separate ``bmm`` become one launch, and the
    result is batch-invariant like the rest.

    Args:
        q_lat: ``[H, T, R]`` fp16/bf16 (the kernel) or fp32/fp64 (the reference), any
            strides.
        q_pe: ``[H, T, P]``, ``q_lat``'s dtype.
        c_kv: ``[L, R]``, ``q_lat``'s dtype.
        k_pe: ``[L, P]``, ``q_lat``'s dtype.
        scale: multiplies the scores.
        mask: None (bottom-right causal), bool ``[T, L]`` or additive float ``[T, L]`` (any
            strides, e.g. a broadcast view).
        w_uv: None, or ``W_UV [H, V, R]`` of ``q_lat``'s dtype (any strides, e.g. a view of
            ``kv_b_proj``'s weight).

    Returns:
        ``o_lat [H, T, R]`` contiguous, in ``q_lat``'s dtype; with ``w_uv``,
        ``out [T, H, V]`` contiguous.

    Raises:
        TypeError: non-tensors or mixed dtypes.
        ValueError: shapes that do not fit or tensors on several devices.
    """
    H, T, R, L, _ = _check(q_lat, q_pe, c_kv, k_pe, mask)
    if w_uv is not None:
        _check_w_uv(w_uv, q_lat, H, R)
    if (
        T == 0
        or L == 0
        or q_lat.dtype not in HALF_DTYPES  # fp32/fp64 models: exact products, no TF32
        or select_backend(q_lat.device) == "torch"
    ):
        return mla_attention_reference(q_lat, q_pe, c_kv, k_pe, scale, mask, w_uv)
    from specter_kernels.attention.mla_attention_triton import launch_mla_attention

    q_lat, q_pe, c_kv, k_pe = (
        t if t.stride(-1) == 1 else t.contiguous() for t in (q_lat, q_pe, c_kv, k_pe)
    )
    if w_uv is not None and w_uv.stride(-1) != 1:
        w_uv = w_uv.contiguous()
    return launch_mla_attention(q_lat, q_pe, c_kv, k_pe, float(scale), mask, w_uv)


def _check_w_uv(w_uv: torch.Tensor, q_lat: torch.Tensor, H: int, R: int) -> None:
    if not isinstance(w_uv, torch.Tensor):
        raise TypeError(f"w_uv must be None or a tensor, got {type(w_uv).__name__}")
    if w_uv.dtype != q_lat.dtype or w_uv.device != q_lat.device:
        raise TypeError(
            f"w_uv must have q_lat's dtype {q_lat.dtype} on {q_lat.device}, got {w_uv.dtype} "
            f"on {w_uv.device}"
        )
    if w_uv.dim() != 3 or w_uv.shape[0] != H or w_uv.shape[2] != R or w_uv.shape[1] == 0:
        raise ValueError(
            f"w_uv must be W_UV [H, V, R] = [{H}, V, {R}] with V >= 1, got {tuple(w_uv.shape)}"
        )


def _visible(mask: torch.Tensor | None, T: int, L: int, device: torch.device) -> torch.Tensor:
    if mask is None:
        rows = torch.arange(T, device=device)[:, None] + (L - T)
        return torch.arange(L, device=device)[None, :] <= rows
    if mask.dtype == torch.bool:
        return mask
    return torch.ones(T, L, dtype=torch.bool, device=device)


def _check(q_lat, q_pe, c_kv, k_pe, mask) -> tuple[int, int, int, int, int]:
    names = (("q_lat", q_lat), ("q_pe", q_pe), ("c_kv", c_kv), ("k_pe", k_pe))
    for name, tensor in names:
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(tensor).__name__}")
    if not (q_lat.dtype == q_pe.dtype == c_kv.dtype == k_pe.dtype) or not (
        q_lat.is_floating_point()
    ):
        raise TypeError(
            "q_lat, q_pe, c_kv and k_pe must share one floating dtype, got "
            f"{[t.dtype for _, t in names]}"
        )
    if any(t.device != q_lat.device for _, t in names) or (
        mask is not None and mask.device != q_lat.device
    ):
        raise ValueError("q_lat, q_pe, c_kv, k_pe and mask must be on one device")
    if q_lat.dim() != 3 or q_pe.dim() != 3 or c_kv.dim() != 2 or k_pe.dim() != 2:
        raise ValueError(
            "mla_attention needs q_lat [H, T, R], q_pe [H, T, P], c_kv [L, R], k_pe [L, P], "
            f"got {[tuple(t.shape) for _, t in names]}"
        )
    H, T, R = q_lat.shape
    L, P = k_pe.shape
    if tuple(q_pe.shape[:2]) != (H, T) or tuple(c_kv.shape) != (L, R) or q_pe.shape[2] != P:
        raise ValueError(
            f"shapes do not fit: q_lat {tuple(q_lat.shape)}, q_pe {tuple(q_pe.shape)}, c_kv "
            f"{tuple(c_kv.shape)}, k_pe {tuple(k_pe.shape)}; expected q_lat [H, T, R], q_pe "
            "[H, T, P], c_kv [L, R], k_pe [L, P]"
        )
    if mask is not None and (not isinstance(mask, torch.Tensor) or tuple(mask.shape) != (T, L)):
        raise ValueError(
            f"mask must be None or a [T, L] = [{T}, {L}] tensor, got "
            f"{tuple(getattr(mask, 'shape', ())) or type(mask).__name__}"
        )
    return H, T, R, L, P
