"""The residual add, the RMSNorm and the MoE router of a pre-norm MoE layer in one launch.

After its attention a DeepSeek-V2 or Qwen2-MoE decoder layer runs ``add_rms_norm`` (the
residual add and ``post_attention_layernorm``) and then the router (``router_topk``) on the
normed row: two launches, the router's waiting for the norm's to finish before it reads its
256 KB weight. :func:`add_rms_norm_router_topk` does both in the router's launch: one
program per (row, expert) loads its expert's router row before waiting for the attention's
output, computes the row's sum and norm (every program the same row, with ``add_rms_norm``'s
arithmetic), and its logit with ``router_topk``'s; the row's last program selects::

    summed = residual + x                       (rounded to the inputs' dtype)
    normed = rms_norm(summed, norm_weight, eps)
    logits, weights, ids = router_topk(normed, gate_weight, top_k, ...)

``summed`` and ``normed`` have the bits of ``add_rms_norm``; the logits have ``router_topk``'s
arithmetic on ``normed`` (its bits where both use one warp count: hidden sizes of 2048 and
more on CUDA, every size under the interpreter). A row's results never depend on the other
rows (batch-invariant by construction). Rows wider than
:data:`~specter_kernels.norm_router_triton.MAX_HIDDEN`, routers wider than
``router_topk.MAX_EXPERTS`` and the CPU take the two calls.
"""

from __future__ import annotations

import torch

from specter_kernels.backend import FLOAT_DTYPES, select_backend
from specter_kernels.residual_norm import add_rms_norm, add_rms_norm_reference
from specter_kernels.router_topk import MAX_EXPERTS, router_topk, router_topk_reference

RouterOutputs = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def add_rms_norm_router_topk_reference(
    x: torch.Tensor,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    gate_weight: torch.Tensor,
    top_k: int,
    **router: object,
) -> tuple[torch.Tensor, torch.Tensor, RouterOutputs]:
    """``add_rms_norm_reference`` and ``router_topk_reference`` of its normed rows, in torch
    (``router``: ``router_topk``'s keyword arguments)."""
    summed, normed = add_rms_norm_reference(x, residual, norm_weight, eps)
    return summed, normed, router_topk_reference(normed, gate_weight, top_k, **router)  # type: ignore[arg-type]


def add_rms_norm_router_topk(
    x: torch.Tensor,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    gate_weight: torch.Tensor,
    top_k: int,
    *,
    logits_dtype: torch.dtype = torch.float32,
    renormalize: bool = False,
    scaling: float = 1.0,
    weights_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor, RouterOutputs]:
    """``add_rms_norm(x, residual, norm_weight, eps)`` and ``router_topk`` of its normed rows
    by ``gate_weight``, in one launch on CUDA (see the module docstring).

    Args:
        x: ``[T, H]`` fp16, bf16 or fp32 (any row stride), added to ``residual``.
        residual: ``[T, H]``, ``x``'s dtype and device.
        norm_weight: ``[H]``, the RMSNorm's weight.
        eps: added to the mean square, >= 0.
        gate_weight: ``[E, H]``, the router's weight.
        top_k: experts per token, ``1 <= top_k <= E``.
        logits_dtype, renormalize, scaling, weights_dtype: as ``router_topk``'s.

    Returns:
        ``(summed [T, H], normed [T, H], (logits [T, E], weights [T, top_k], ids [T, top_k]))``
        as ``add_rms_norm`` and ``router_topk`` return them.

    Raises:
        TypeError, ValueError: what ``add_rms_norm`` or ``router_topk`` raise for these
            arguments (checked before anything runs).
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(
            f"add_rms_norm_router_topk takes x as [T, H] rows, got "
            f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}"
        )
    router = {
        "logits_dtype": logits_dtype, "renormalize": renormalize, "scaling": scaling,
        "weights_dtype": weights_dtype,
    }  # fmt: skip
    if not _fused_applies(x, residual, norm_weight, eps, gate_weight, top_k, router):
        # The two calls check every argument (and the empty or CPU case is theirs).
        summed, normed = add_rms_norm(x, residual, norm_weight, eps)
        return summed, normed, router_topk(normed, gate_weight, top_k, **router)  # type: ignore[arg-type]
    from specter_kernels.norm_router_triton import launch_add_norm_router

    summed, normed, *routed = launch_add_norm_router(
        x if x.stride(1) == 1 else x.contiguous(),
        residual if residual.stride(1) == 1 else residual.contiguous(),
        norm_weight.contiguous(),
        float(eps),
        gate_weight.contiguous(),
        top_k,
        normed_dtype=torch.promote_types(norm_weight.dtype, x.dtype),
        logits_dtype=logits_dtype,
        renormalize=renormalize,
        scaling=float(scaling),
        weights_dtype=weights_dtype,
    )
    return summed, normed, tuple(routed)  # type: ignore[return-value]


def _fused_applies(
    x: torch.Tensor,
    residual: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    gate_weight: torch.Tensor,
    top_k: object,
    router: dict[str, object],
) -> bool:
    """Whether the one launch takes these arguments: every one well formed (else the two
    calls raise their errors), on the Triton backend, within its sizes."""
    from specter_kernels.norm_router_triton import MAX_HIDDEN

    tensors = (x, residual, norm_weight, gate_weight)
    if not all(isinstance(t, torch.Tensor) and t.dtype in FLOAT_DTYPES for t in tensors):
        return False
    T, H = x.shape
    E = gate_weight.shape[0] if gate_weight.dim() == 2 else 0
    return (
        residual.shape == x.shape
        and residual.dtype == x.dtype
        and norm_weight.shape == (H,)
        and gate_weight.shape == (E, H)
        and len({t.device for t in (x, residual, norm_weight, gate_weight)}) == 1
        and isinstance(top_k, int)
        and not isinstance(top_k, bool)
        and 1 <= top_k <= E <= MAX_EXPERTS
        and all(router[k] in FLOAT_DTYPES for k in ("logits_dtype", "weights_dtype"))
        and T > 0
        and isinstance(eps, int | float)
        and not isinstance(eps, bool)
        and eps >= 0
        and H <= MAX_HIDDEN
        and select_backend(x.device) == "triton"
    )
