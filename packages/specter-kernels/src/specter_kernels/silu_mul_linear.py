"""SwiGLU's activation and the down projection after it, in one launch where they can be.

A dense or shared-expert SwiGLU MLP ends with::

    h [..., 2I] (gate half first) -> silu_and_mul -> [..., I] -> down linear -> [..., H]

At decode sizes the activation is a launch of its own (about 2 us inside a CUDA graph on an
H200) in front of a GEMV that reads megabytes. :func:`silu_mul_linear` makes the GEMV build
its input from ``h`` itself (``invariant_gemv_triton``'s ``GLU``): the same elements, with
``silu_and_mul``'s bits, then the same GEMV, so the result has the bits of
``invariant_linear(silu_and_mul(h), weight)`` in one launch. Where the GEMV does not apply
(the CPU, a shape the GEMV tiles leave to the tensor cores, an ``I`` that is not a multiple
of 8) it runs exactly those two calls.

Every GEMV program recomputes the activation of its rows' whole ``I`` (``N / BLOCK_N``
times the elementwise kernel's arithmetic, libdevice's ``exp`` and an IEEE division per
element): one launch fewer, but more work in the one left. Compare
:func:`specter_kernels.swiglu_linear`, which puts the activation in the gate/up GEMV instead,
where each program computes only its own columns' activation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from specter_kernels.backend import select_backend
from specter_kernels.invariant_matmul import SUPPORTED_DTYPES, invariant_linear
from specter_kernels.silu_and_mul import silu_and_mul, silu_and_mul_reference


def silu_mul_linear_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """torch's expression: ``F.linear(silu(x[..., :I]) * x[..., I:], weight)``.

    Args:
        x: ``[..., 2I]``, gate half first.
        weight: ``[N, I]``.

    Returns:
        ``[..., N]`` in ``x``'s dtype.
    """
    _check(x, weight, dtypes=None)
    return F.linear(silu_and_mul_reference(x), weight)


def silu_mul_linear(
    x: torch.Tensor, weight: torch.Tensor, *, constant_weight: bool = False
) -> torch.Tensor:
    """``invariant_linear(silu_and_mul(x), weight)`` with its bits, in one launch where the
    invariant GEMV applies (see the module docstring).

    Args:
        x: ``[..., 2I]`` fp16, bf16 or fp32, gate half first (a gate/up projection's output).
        weight: ``[N, I]``, ``x``'s dtype and device (the down projection, no bias).
        constant_weight: no kernel queued before this call writes ``weight`` (a model's
            parameter), as ``invariant_linear``'s: the GEMV may load it before its PDL wait.

    Returns:
        ``[..., N]`` in ``x``'s dtype, batch-invariant (each row's bits whatever the rows).

    Raises:
        TypeError: a non-tensor, an unsupported dtype, or ``x`` and ``weight`` of two dtypes.
        ValueError: ``weight`` not 2-D, or ``x``'s last dim not twice ``weight``'s ``I``.
    """
    _check(x, weight)
    N, inter = weight.shape
    rows = x.reshape(-1, 2 * inter)
    if (
        rows.shape[0]
        and N
        and inter % 8 == 0
        and weight.stride(1) == 1
        and select_backend(x.device) == "triton"
    ):
        from specter_kernels.invariant_gemv_config import gemv_config
        from specter_kernels.invariant_gemv_triton import launch_invariant_gemv
        from specter_kernels.invariant_matmul_triton import device_name

        # The tile invariant_linear would give the [.., I] input: the same GEMV, so the
        # same bits (the choice looks at N, I and the dtype only, never at the rows).
        config = gemv_config(N, inter, x.dtype, device_name(x.device))
        if config is not None:
            out = torch.empty(rows.shape[0], N, dtype=x.dtype, device=x.device)
            launch_invariant_gemv(rows, weight, out, None, config, constant_weight, glu=True)
            return out.reshape(*x.shape[:-1], N)
    return invariant_linear(silu_and_mul(x), weight, constant_weight=constant_weight)


def _check(
    x: torch.Tensor, weight: torch.Tensor, dtypes: tuple[torch.dtype, ...] | None = SUPPORTED_DTYPES
) -> None:
    """Tensors of one dtype (one of ``dtypes`` unless None), ``x [..., 2I]``, ``weight [N, I]``."""
    for name, tensor in (("x", x), ("weight", weight)):
        if not isinstance(tensor, torch.Tensor):
            kind = type(tensor).__name__
            raise TypeError(f"silu_mul_linear: {name} must be a tensor, got {kind}")
        if dtypes is not None and tensor.dtype not in dtypes:
            raise TypeError(
                f"silu_mul_linear: {name} has dtype {tensor.dtype}; expected one of {dtypes}"
            )
    if x.dtype != weight.dtype:
        raise TypeError(
            f"silu_mul_linear: x is {x.dtype} but weight is {weight.dtype}; cast them to one dtype"
        )
    if weight.dim() != 2:
        raise ValueError(f"silu_mul_linear: weight must be [N, I], got {tuple(weight.shape)}")
    if x.dim() < 1 or x.shape[-1] != 2 * weight.shape[1]:
        raise ValueError(
            f"silu_mul_linear: x {tuple(x.shape)} must be [..., 2I] (gate and up halves) for "
            f"weight {tuple(weight.shape)} [N, I], so its last dim must be {2 * weight.shape[1]}"
        )
