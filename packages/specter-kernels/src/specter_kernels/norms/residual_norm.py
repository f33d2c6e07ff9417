"""The residual stream's adds, fused: the add before a norm, and a block's two-branch add.

A pre-norm decoder layer (DeepSeek-V2's, Qwen2-MoE's) runs, per layer::

    h = residual + attention(input_norm(residual))  # an add
    out = h + mlp(post_attention_norm(h))  # another, and inside a block
    # with shared experts
    # mlp(x) = routed(x) + shared(x)

At batch size one each add is its own kernel launch of a few kilobytes, which inside a CUDA
graph still costs about a microsecond plus its gap. Two fusions remove two launches a layer:

* :func:`add_rms_norm` returns ``(residual + x, rms_norm(residual + x))`` in one launch: the
  sum is rounded to the inputs' dtype first, exactly as torch's add rounds it, and the norm
  is ``rms_norm``'s arithmetic on those rounded values, so both outputs have the bits of the
  two separate calls.
* :func:`residual_add` returns ``residual + (a + b)`` in one launch, with the inner sum
  rounded to the dtype first, as the two torch adds round it.

Each row is one program with a fixed reduction order, so both are batch-invariant.
"""

from __future__ import annotations

import torch

from specter_kernels.backend import FLOAT_DTYPES, select_backend
from specter_kernels.norms.rms_norm import check_norm_args, rms_norm_reference


def add_rms_norm_reference(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(residual + x, rms_norm_reference(residual + x, weight, eps))`` in plain torch.

    Args:
        x: ``[..., N]``, added to ``residual``.
        residual: ``[..., N]``, ``x``'s shape and dtype.
        weight: ``[N]``.
        eps: added to the mean square.

    Returns:
        ``summed [..., N]`` in the inputs' dtype and ``normed [..., N]`` in the promotion
        of ``weight``'s and the inputs' dtypes.
    """
    summed = residual + x
    return summed, rms_norm_reference(summed, weight, eps)


def residual_add_reference(
    residual: torch.Tensor, a: torch.Tensor, b: torch.Tensor
) -> torch.Tensor:
    """``residual + (a + b)`` in plain torch (every tensor ``[..., N]`` of one dtype)."""
    return residual + (a + b)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual add and the RMSNorm after it in one launch (Triton on CUDA, the
    reference elsewhere); the bits of ``residual + x`` and ``rms_norm`` of it.

    Args:
        x: ``[..., N]`` fp16, bf16 or fp32, any strides.
        residual: ``[..., N]``, ``x``'s shape, dtype and device.
        weight: ``[N]`` fp16, bf16 or fp32.
        eps: added to the mean square, >= 0.

    Returns:
        ``(summed, normed)``: ``summed [..., N]`` in the inputs' dtype (contiguous), and
        ``normed [..., N]`` in the promotion of ``weight``'s and the inputs' dtypes.

    Raises:
        TypeError: an unsupported dtype, or ``x`` and ``residual`` of different dtypes.
        ValueError: mismatched shapes or devices, or a negative ``eps``.
    """
    _check_float("add_rms_norm", x=x, residual=residual, weight=weight)
    _check_same("add_rms_norm", x, residual=residual)
    N = check_norm_args("add_rms_norm", x, weight, eps)
    if x.numel() == 0 or select_backend(x.device) == "torch":
        return add_rms_norm_reference(x, residual, weight, eps)
    from specter_kernels.norms.residual_norm_triton import launch_add_rms_norm

    out_dtype = torch.promote_types(weight.dtype, x.dtype)
    summed, normed = launch_add_rms_norm(
        _rows(x, N), _rows(residual, N), weight.contiguous(), float(eps), out_dtype
    )
    return summed.reshape(x.shape), normed.reshape(x.shape)


def residual_add(residual: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``residual + (a + b)`` in one launch (Triton on CUDA, the reference elsewhere),
    the inner sum rounded to the dtype first: the bits of the two torch adds.

    Args:
        residual: ``[..., N]`` fp16, bf16 or fp32, any strides.
        a: ``[..., N]``, ``residual``'s shape, dtype and device.
        b: the same.

    Returns:
        ``[..., N]`` in the inputs' dtype, contiguous.

    Raises:
        TypeError: an unsupported dtype, or inputs of different dtypes.
        ValueError: mismatched shapes or devices.
    """
    _check_float("residual_add", residual=residual, a=a, b=b)
    _check_same("residual_add", residual, a=a, b=b)
    if residual.dim() < 1:
        raise ValueError("residual_add needs tensors of at least one dimension, got scalars")
    if residual.numel() == 0 or select_backend(residual.device) == "torch":
        return residual_add_reference(residual, a, b)
    from specter_kernels.norms.residual_norm_triton import launch_residual_add

    N = residual.shape[-1]
    out = launch_residual_add(_rows(residual, N), _rows(a, N), _rows(b, N))
    return out.reshape(residual.shape)


def _check_float(op: str, **tensors: torch.Tensor) -> None:
    for name, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{op}: {name} must be a tensor, got {type(tensor).__name__}")
        if tensor.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{op}: {name} has dtype {tensor.dtype}; it takes {FLOAT_DTYPES}")


def _check_same(op: str, first: torch.Tensor, **others: torch.Tensor) -> None:
    """Every tensor of ``others`` has ``first``'s shape, dtype and device."""
    for name, tensor in others.items():
        if tensor.dtype != first.dtype:
            raise TypeError(
                f"{op}: {name} has dtype {tensor.dtype} but the first input has {first.dtype}; "
                "cast them to one dtype"
            )
        if tensor.shape != first.shape or tensor.device != first.device:
            raise ValueError(
                f"{op}: {name} is {tuple(tensor.shape)} on {tensor.device}, expected the "
                f"first input's {tuple(first.shape)} on {first.device}"
            )


def _rows(t: torch.Tensor, N: int) -> torch.Tensor:
    """``t`` as ``[R, N]`` rows with unit stride along N (a view where it can be)."""
    rows = t.reshape(-1, N)
    return rows if rows.stride(1) == 1 else rows.contiguous()
