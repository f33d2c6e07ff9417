"""Batch-invariant row reductions and the normalisations built on them.

Torch's reductions pick their launch shape from the tensor they reduce: a CUDA
``sum``/``mean`` over the last dim splits a row across more or fewer threads
(and, for few rows, across blocks) depending on how many rows there are, and
``softmax``/``layer_norm``/``rms_norm`` choose between per-row and per-warp
kernels the same way. So a row's rounding depends on its neighbours. Here every
reduction is :func:`invariant_row_sum` (one program per row, a fixed lane
layout, see :mod:`specter_kernels.invariant.row_sum_triton`) and everything
else is elementwise (``amax`` is exact in any order). On the GPU the softmaxes run
as one kernel with the same lanes (:mod:`specter_kernels.invariant.softmax_triton`).

On the CPU (backend ``torch``) the reference mirrors the kernel's lanes with
elementwise adds over rows padded to a multiple of ``ROW_SUM_BLOCK``; the
padding also keeps torch's vectorised CPU ``exp``/``log`` from treating a row's
tail differently from its body.
"""

from __future__ import annotations

import torch

from specter_kernels.backend import select_backend

ROW_SUM_BLOCK = 1024  # equals invariant_row_sum_triton.ROW_SUM_BLOCK (kept import-free of triton)
SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _check_float(x: torch.Tensor, name: str = "x") -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(x).__name__}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name} has dtype {x.dtype}; expected one of {SUPPORTED_DTYPES}")
    if x.dim() < 1:
        raise ValueError(f"{name} must have at least one dim, got a scalar")


def _check_last_dim(x: torch.Tensor, dim: int) -> None:
    if dim not in (-1, x.dim() - 1):
        raise ValueError(
            f"dim={dim} is not the last dim of a {x.dim()}-d tensor; batch-invariant reductions "
            f"run over the last dim only (move the dim last with transpose)"
        )


def _padded_rows(x: torch.Tensor, fill: float) -> torch.Tensor:
    """fp32 ``[R, P]`` rows of ``x [..., N]`` padded with ``fill`` to a multiple of the block."""
    N = x.shape[-1]
    rows = x.reshape(-1, N).float()
    pad = (-N) % ROW_SUM_BLOCK if N else ROW_SUM_BLOCK
    if pad:
        rows = torch.cat([rows, rows.new_full((rows.shape[0], pad), fill)], dim=1)
    return rows


def _lane_sum(padded: torch.Tensor) -> torch.Tensor:
    """Sum ``[R, P]`` rows (P a multiple of the block) with the kernel's lane layout: ``[R]``."""
    acc = padded[:, :ROW_SUM_BLOCK].clone()
    for start in range(ROW_SUM_BLOCK, padded.shape[1], ROW_SUM_BLOCK):
        acc += padded[:, start : start + ROW_SUM_BLOCK]
    width = ROW_SUM_BLOCK
    while width > 1:  # a fixed pairwise tree: elementwise adds only
        width //= 2
        acc = acc[:, :width] + acc[:, width : 2 * width]
    return acc[:, 0]


def invariant_row_sum_reference(
    x: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Torch reference of :func:`invariant_row_sum` (invariant by construction)."""
    _check_float(x)
    return _lane_sum(_padded_rows(x, 0.0)).reshape(x.shape[:-1]).to(dtype)


def invariant_row_sum(x: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Sum over the last dim with fp32 accumulation, bit-identical per row for any row count.

    Args:
        x: ``[..., N]`` fp16, bf16 or fp32, any strides.
        dtype: result dtype (the sum is fp32 until this final cast).

    Returns:
        ``[...]`` sums.

    Raises:
        TypeError: unsupported dtype.
    """
    _check_float(x)
    N = x.shape[-1]
    if x.numel() == 0:
        return torch.zeros(x.shape[:-1], dtype=dtype, device=x.device)
    if select_backend(x.device) == "torch":
        return invariant_row_sum_reference(x, dtype)
    from specter_kernels.invariant.row_sum_triton import launch_invariant_row_sum

    return launch_invariant_row_sum(x.reshape(-1, N)).reshape(x.shape[:-1]).to(dtype)


def invariant_mean(
    x: torch.Tensor, keepdim: bool = False, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Batch-invariant mean over the last dim (fp32 sum divided by N, cast to ``dtype``).

    Raises:
        TypeError: unsupported dtype.
    """
    if dtype is not None:
        x = x.to(dtype)
    _check_float(x)
    mean = (invariant_row_sum(x) / x.shape[-1]).to(x.dtype)
    return mean.unsqueeze(-1) if keepdim else mean


def _exp_shifted(x: torch.Tensor, zero_masked_rows: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(``exp(x - rowmax)`` fp32 ``[R, P]``, row sums ``[R, 1]``) for ``x [..., N]``."""
    N = x.shape[-1]
    torch_backend = select_backend(x.device) == "torch"
    rows = _padded_rows(x, float("-inf")) if torch_backend else x.reshape(-1, N).float()
    row_max = rows.amax(dim=1, keepdim=True)  # exact in any order
    if zero_masked_rows:  # an all -inf row gives exp(-inf) = 0 instead of NaN
        row_max = torch.where(torch.isneginf(row_max), 0.0, row_max)
    e = torch.exp(rows - row_max)
    if torch_backend:
        return e, _lane_sum(e).unsqueeze(1)
    from specter_kernels.invariant.row_sum_triton import launch_invariant_row_sum

    return e, launch_invariant_row_sum(e).unsqueeze(1)


def _rowwise_log(values: torch.Tensor) -> torch.Tensor:
    """``log`` of ``[R, 1]`` values so that every row takes the same CPU code path."""
    if values.device.type != "cpu":
        return torch.log(values)
    # Each value starts its own 64-wide row: always the vectorised branch.
    return torch.log(values.expand(-1, 64).contiguous())[:, :1]


def _softmax(
    x: torch.Tensor, dim: int, dtype: torch.dtype | None, log: bool, zero_masked_rows: bool
) -> torch.Tensor:
    _check_float(x)
    _check_last_dim(x, dim)
    if dtype is not None:
        x = x.to(dtype)
    N = x.shape[-1]
    if x.numel() == 0:
        return torch.empty_like(x)
    if select_backend(x.device) != "torch":
        # One launch per softmax (specter_kernels.invariant.softmax_triton), same lanes.
        from specter_kernels.invariant.softmax_triton import launch_invariant_softmax

        out = launch_invariant_softmax(x.reshape(-1, N), log, zero_masked_rows, x.dtype)
        return out.reshape(x.shape)
    e, sums = _exp_shifted(x, zero_masked_rows)
    if log:
        rows = _padded_rows(x, float("-inf")) if e.shape[1] != N else x.reshape(-1, N).float()
        row_max = rows.amax(dim=1, keepdim=True)
        out = rows - row_max - _rowwise_log(sums)
    else:
        out = e / sums
        if zero_masked_rows:
            out = torch.where(sums == 0, 0.0, out)
    return out[:, :N].reshape(x.shape).to(x.dtype)


def invariant_softmax(
    x: torch.Tensor, dim: int = -1, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Batch-invariant softmax over the last dim (fp32 inside, result in ``dtype or x.dtype``).

    ``exp(x - max)`` divided by its invariant row sum. A row of all ``-inf``
    gives NaN, as ``torch.softmax`` does.

    Raises:
        ValueError: ``dim`` is not the last dim.
        TypeError: unsupported dtype.
    """
    return _softmax(x, dim, dtype, log=False, zero_masked_rows=False)


def invariant_log_softmax(
    x: torch.Tensor, dim: int = -1, dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Batch-invariant log-softmax over the last dim: ``x - max - log(sum(exp(x - max)))``.

    Raises:
        ValueError: ``dim`` is not the last dim.
        TypeError: unsupported dtype.
    """
    return _softmax(x, dim, dtype, log=True, zero_masked_rows=False)


def _check_affine(x: torch.Tensor, normalized_shape, params: dict) -> None:
    _check_float(x)
    shape = (
        tuple(normalized_shape) if not isinstance(normalized_shape, int) else (normalized_shape,)
    )
    if shape != (x.shape[-1],):
        raise ValueError(
            f"normalized_shape {shape} must be the last dim ({x.shape[-1]},) of x "
            f"{tuple(x.shape)}; batch-invariant norms normalise the last dim only"
        )
    for name, p in params.items():
        if p is not None and tuple(p.shape) != shape:
            raise ValueError(f"{name} must be {shape}, got {tuple(p.shape)}")


def invariant_layer_norm(
    x: torch.Tensor,
    normalized_shape,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """Batch-invariant ``F.layer_norm`` over the last dim (two invariant row sums, fp32).

    Returns:
        ``x``'s shape and dtype.

    Raises:
        ValueError: ``normalized_shape`` is not the last dim, or weight/bias shapes differ.
    """
    _check_affine(x, normalized_shape, {"weight": weight, "bias": bias})
    xf = x.float()
    N = x.shape[-1]
    mean = (invariant_row_sum(xf) / N).unsqueeze(-1)
    centred = xf - mean
    var = (invariant_row_sum(centred * centred) / N).unsqueeze(-1)
    y = centred * torch.rsqrt(var + eps)
    if weight is not None:
        y = y * weight.float()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


def invariant_rms_norm(
    x: torch.Tensor,
    normalized_shape,
    weight: torch.Tensor | None = None,
    eps: float | None = None,
) -> torch.Tensor:
    """Batch-invariant ``F.rms_norm`` over the last dim: ``x * rsqrt(mean(x^2) + eps) * weight``.

    ``eps=None`` means ``torch.finfo(x.dtype).eps``, as in ``F.rms_norm``.

    Raises:
        ValueError: ``normalized_shape`` is not the last dim, or the weight shape differs.
    """
    _check_affine(x, normalized_shape, {"weight": weight})
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    xf = x.float()
    mean_sq = (invariant_row_sum(xf * xf) / x.shape[-1]).unsqueeze(-1)
    y = xf * torch.rsqrt(mean_sq + eps)
    if weight is not None:
        y = y * weight.float()
    return y.to(x.dtype)
