"""An MoE block's residual join and the next layer's RMSNorm in one launch.

A pre-norm decoder layer ends with the join ``out = residual + (routed + shared)`` of its
MoE block and the next layer starts with ``input_layernorm(out)`` (the last layer: the
model's final norm). At batch size one each is a kernel of a few kilobytes that mostly
waits on the one before; fused, a decode step has one launch fewer per MoE layer:

* :func:`residual_add_rms_norm`: ``residual_add`` (``routed`` a ``[T, H]`` tensor, as the
  draft's routed experts return it) then ``rms_norm``;
* :func:`residual_add_routed_pairs_rms_norm`: ``residual_add_routed_pairs`` (the routed
  pairs, fp32 ``[T, k, H]``, summed in pair order, as the batch-invariant target keeps them)
  then ``rms_norm``.

Each returns ``(summed, normed)`` with the bits of the two calls it replaces (the join's
roundings element by element, then ``rms_norm``'s block, lanes and reduction tree on the
stored sum), and each row depends on itself only, so both are batch-invariant.
"""

from __future__ import annotations

import torch

from specter_kernels.backend import FLOAT_DTYPES, select_backend
from specter_kernels.moe.grouped_fp16 import (
    _check_routed_join,
    residual_add_routed_pairs_reference,
)
from specter_kernels.norms.residual_norm import residual_add_reference
from specter_kernels.norms.rms_norm import check_norm_args, rms_norm_reference


def residual_add_rms_norm_reference(
    residual: torch.Tensor, routed: torch.Tensor, shared: torch.Tensor, weight: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``(s, rms_norm_reference(s, weight, eps))`` with ``s = residual + (routed + shared)``."""
    return _with_norm(residual_add_reference(residual, routed, shared), weight, eps)


def residual_add_routed_pairs_rms_norm_reference(
    residual: torch.Tensor, pairs: torch.Tensor, shared: torch.Tensor, weight: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``(s, rms_norm_reference(s, weight, eps))`` with ``s`` the routed pairs' join
    (:func:`specter_kernels.residual_add_routed_pairs_reference`)."""
    return _with_norm(residual_add_routed_pairs_reference(residual, pairs, shared), weight, eps)


def _with_norm(
    summed: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return summed, rms_norm_reference(summed, weight, eps)


def residual_add_rms_norm(
    residual: torch.Tensor, routed: torch.Tensor, shared: torch.Tensor, weight: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``residual + (routed + shared)`` and its RMSNorm in one launch on CUDA.

    Args:
        residual: ``[T, H]`` fp16, bf16 or fp32 (the decoder layer's residual stream).
        routed: ``[T, H]``, ``residual``'s dtype and device (the routed experts' output).
        shared: the same (the shared experts' output).
        weight: ``[H]`` fp16, bf16 or fp32 (the next norm's weight).
        eps: added to the mean square, >= 0.

    Returns:
        ``(summed, normed)``: ``summed [T, H]`` contiguous in ``residual``'s dtype, with
        ``residual_add``'s bits; ``normed [T, H]`` in the promotion of ``weight``'s and
        ``residual``'s dtypes, with ``rms_norm(summed, weight, eps)``'s bits.

    Raises:
        TypeError: an unsupported dtype, or dtypes that differ.
        ValueError: shapes or devices that differ, or a negative ``eps``.
    """
    _check_tensors(residual, routed=routed, shared=shared, weight=weight)
    for name, t in (("routed", routed), ("shared", shared)):
        if t.shape != residual.shape or t.dtype != residual.dtype or t.device != residual.device:
            raise ValueError(
                f"residual_add_rms_norm: {name} must match residual ({tuple(residual.shape)} "
                f"{residual.dtype} on {residual.device}), got {tuple(t.shape)} {t.dtype} on "
                f"{t.device}"
            )
    check_norm_args("residual_add_rms_norm", residual, weight, eps)
    if residual.numel() == 0 or select_backend(residual.device) == "torch":
        return residual_add_rms_norm_reference(residual, routed, shared, weight, eps)
    return _launch(routed.contiguous(), residual, shared, weight, eps)


def residual_add_routed_pairs_rms_norm(
    residual: torch.Tensor, pairs: torch.Tensor, shared: torch.Tensor, weight: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The routed pairs' join (:func:`specter_kernels.residual_add_routed_pairs`) and its
    RMSNorm in one launch on CUDA.

    Args:
        residual: ``[T, H]`` fp16, bf16 or fp32.
        pairs: fp32 ``[T, k, H]``, one row per routed pair, weighted already.
        shared: ``[T, H]``, ``residual``'s dtype and device.
        weight: ``[H]`` fp16, bf16 or fp32.
        eps: added to the mean square, >= 0.

    Returns:
        ``(summed, normed)`` as :func:`residual_add_rms_norm` (``summed`` with
        ``residual_add_routed_pairs``'s bits).

    Raises:
        TypeError, ValueError: as :func:`residual_add_rms_norm`, or ``pairs`` not fp32
            ``[T, k, H]``.
    """
    _check_tensors(residual, shared=shared, weight=weight)
    _check_routed_join(residual, pairs, shared)
    check_norm_args("residual_add_routed_pairs_rms_norm", residual, weight, eps)
    T, k, H = pairs.shape
    if T == 0 or k == 0 or H == 0 or select_backend(pairs.device) == "torch":
        return residual_add_routed_pairs_rms_norm_reference(residual, pairs, shared, weight, eps)
    if pairs.stride(2) != 1:
        pairs = pairs.contiguous()
    return _launch(pairs, residual, shared, weight, eps)


def _launch(routed, residual, shared, weight, eps):
    from specter_kernels.moe.join_norm_triton import launch_join_rms_norm

    out_dtype = torch.promote_types(weight.dtype, residual.dtype)
    return launch_join_rms_norm(
        routed, residual.contiguous(), shared.contiguous(), weight.contiguous(), float(eps),
        out_dtype,
    )  # fmt: skip


def _check_tensors(residual: torch.Tensor, **others: torch.Tensor) -> None:
    for name, t in (("residual", residual), *others.items()):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
        if t.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; expected one of {FLOAT_DTYPES}")
    if residual.dim() != 2:
        raise ValueError(f"residual must be [T, H], got shape {tuple(residual.shape)}")
