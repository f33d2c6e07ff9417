"""SwiGLU's gate/up projection and its activation, in one launch where they can be.

A dense or shared-expert SwiGLU MLP starts with::

    x [..., K] -> gate/up linear, weight [2I, K] (gate rows first) -> [..., 2I]
               -> silu_and_mul -> [..., I] -> down linear

At decode sizes the activation is a launch of its own (about 2 us inside a CUDA graph on an
H200) behind a GEMV that reads megabytes. :func:`swiglu_linear` makes the GEMV compute each
gate column beside its up column and store ``silu(gate) * up`` (``invariant_gemv_triton``'s
``SWIGLU``): each column as the plain GEMV computes it, rounded as its store rounds it, then
``silu_and_mul``'s arithmetic, so the result has the bits of
``silu_and_mul(invariant_linear(x, weight))`` in one launch. Where the GEMV does not apply
(the CPU, a shape its tiles leave to the tensor cores) it runs exactly those two calls.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specter_kernels.backend import select_backend
from specter_kernels.invariant_matmul import SUPPORTED_DTYPES, invariant_linear
from specter_kernels.silu_and_mul import silu_and_mul, silu_and_mul_reference


def swiglu_linear_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """torch's expression: ``silu(x @ gate^T) * (x @ up^T)``, ``weight = cat([gate, up])``.

    Args:
        x: ``[..., K]``.
        weight: ``[2I, K]``, gate rows first.

    Returns:
        ``[..., I]`` in ``x``'s dtype.
    """
    _check(x, weight, dtypes=None)
    return silu_and_mul_reference(F.linear(x, weight))


def swiglu_linear(
    x: torch.Tensor, weight: torch.Tensor, *, constant_weight: bool = False
) -> torch.Tensor:
    """``silu_and_mul(invariant_linear(x, weight))`` with its bits, in one launch where the
    invariant GEMV applies (see the module docstring).

    Args:
        x: ``[..., K]`` fp16, bf16 or fp32.
        weight: ``[2I, K]``, ``x``'s dtype and device, gate rows first (a SwiGLU MLP's
            concatenated gate and up projections, no bias).
        constant_weight: no kernel queued before this call writes ``weight`` (a model's
            parameter), as ``invariant_linear``'s: the GEMV may load it before its PDL wait.

    Returns:
        ``[..., I]`` in ``x``'s dtype, batch-invariant (each row's bits whatever the rows).

    Raises:
        TypeError: a non-tensor, an unsupported dtype, or ``x`` and ``weight`` of two dtypes.
        ValueError: ``weight`` not ``[2I, K]`` with ``x``'s ``K``.
    """
    _check(x, weight)
    two_i, K = weight.shape
    rows = x.reshape(-1, K)
    if rows.shape[0] and two_i and weight.stride(1) == 1 and select_backend(x.device) == "triton":
        from specter_kernels.invariant_gemv_config import gemv_config
        from specter_kernels.invariant_gemv_triton import launch_invariant_gemv
        from specter_kernels.invariant_matmul_triton import device_name

        # The tile invariant_linear gives the [2I, K] weight: the same columns, so the same
        # bits (the choice looks at 2I, K and the dtype only, never at the rows).
        config = gemv_config(two_i, K, x.dtype, device_name(x.device))
        if config is not None:
            out = torch.empty(rows.shape[0], two_i // 2, dtype=x.dtype, device=x.device)
            launch_invariant_gemv(rows, weight, out, None, config, constant_weight, swiglu=True)
            return out.reshape(*x.shape[:-1], two_i // 2)
    return silu_and_mul(invariant_linear(x, weight, constant_weight=constant_weight))


def _check(
    x: torch.Tensor, weight: torch.Tensor, dtypes: tuple[torch.dtype, ...] | None = SUPPORTED_DTYPES
) -> None:
    """Tensors of one dtype (one of ``dtypes`` unless None), ``x [..., K]``, ``weight [2I, K]``."""
    for name, tensor in (("x", x), ("weight", weight)):
        if not isinstance(tensor, torch.Tensor):
            kind = type(tensor).__name__
            raise TypeError(f"swiglu_linear: {name} must be a tensor, got {kind}")
        if dtypes is not None and tensor.dtype not in dtypes:
            raise TypeError(
                f"swiglu_linear: {name} has dtype {tensor.dtype}; expected one of {dtypes}"
            )
    if x.dtype != weight.dtype:
        raise TypeError(
            f"swiglu_linear: x is {x.dtype} but weight is {weight.dtype}; cast them to one dtype"
        )
    if weight.dim() != 2 or weight.shape[0] % 2:
        raise ValueError(
            f"swiglu_linear: weight must be [2I, K] (gate rows, then up rows), got "
            f"{tuple(weight.shape)}"
        )
    if x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"swiglu_linear: x {tuple(x.shape)} must be [..., K] with weight "
            f"{tuple(weight.shape)}'s K = {weight.shape[1]}"
        )
