"""Batch-invariant matmul: each output row is bit-identical whatever the row count.

cuBLAS picks its kernel (tile shape, split-K, stream-K) from M, so the same row
multiplied alone or beside 32 others can round differently; speculative
verification (K+1 rows) then drifts from plain decoding (1 row). These
functions run one Triton kernel whose tile shape and split of K depend on
(N, K, dtype) only (see :mod:`specter_kernels.invariant.matmul_config`), with fp32
accumulation; split partial sums are added in a fixed order.

On the CPU (backend ``torch``) the reference evaluates one row at a time,
``a[..., i:i+1, :] @ b`` in fp32, which is batch-invariant by construction.

Example:
    >>> import torch, specter_kernels as sk
    >>> x, w = torch.randn(5, 32), torch.randn(48, 32)
    >>> y = sk.invariant_linear(x, w)  # [5, 48]
    >>> torch.equal(y[:2], sk.invariant_linear(x[:2], w))
    True
"""

from __future__ import annotations

import torch

from specter_kernels.backend import select_backend

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _check_pair(a: torch.Tensor, b: torch.Tensor, names: tuple[str, str], dims: int) -> None:
    for name, tensor in zip(names, (a, b), strict=True):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(tensor).__name__}")
        if tensor.dim() != dims:
            raise ValueError(
                f"{name} must have {dims} dims, got shape {tuple(tensor.shape)}; "
                f"reshape it or use the matching invariant_* function"
            )
        if tensor.dtype not in SUPPORTED_DTYPES:
            raise TypeError(f"{name} has dtype {tensor.dtype}; expected one of {SUPPORTED_DTYPES}")
    if a.dtype != b.dtype:
        raise TypeError(
            f"{names[0]} is {a.dtype} but {names[1]} is {b.dtype}; cast one so they match"
        )
    if a.device != b.device:
        raise ValueError(f"{names[0]} is on {a.device} but {names[1]} is on {b.device}")
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(
            f"cannot multiply {names[0]} {tuple(a.shape)} by {names[1]} {tuple(b.shape)}: "
            f"inner dims {a.shape[-1]} and {b.shape[-2]} differ"
        )


def _check_bias(bias: torch.Tensor | None, N: int, device: torch.device) -> None:
    if bias is not None and (tuple(bias.shape) != (N,) or bias.device != device):
        raise ValueError(f"bias must be [N={N}] on {device}, got {tuple(bias.shape)}")


def _out_dtype(a: torch.Tensor, out_dtype: torch.dtype | None) -> torch.dtype:
    if out_dtype is None:
        return a.dtype
    if out_dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"out_dtype {out_dtype} is not one of {SUPPORTED_DTYPES}")
    return out_dtype


def invariant_bmm_reference(
    a: torch.Tensor,
    b: torch.Tensor,
    out_dtype: torch.dtype | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Row-at-a-time torch reference of :func:`invariant_bmm` (fp32 math, one rounding).

    Args:
        a: ``[B, M, K]``.
        b: ``[B, K, N]``.
        out_dtype: result dtype (default ``a.dtype``).
        bias: optional ``[N]`` added in fp32 before the rounding.

    Returns:
        ``[B, M, N]``.
    """
    dtype = _out_dtype(a, out_dtype)
    B, M, _ = a.shape
    N = b.shape[2]
    if M == 0:
        return torch.empty(B, 0, N, dtype=dtype, device=a.device)
    b32 = b.float()
    rows = [a[:, i : i + 1].float() @ b32 for i in range(M)]
    out = torch.cat(rows, dim=1)
    if bias is not None:
        out = out + bias.float()
    return out.to(dtype)


def invariant_bmm(
    a: torch.Tensor,
    b: torch.Tensor,
    out_dtype: torch.dtype | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Batch-invariant ``a @ b`` for ``[B, M, K] x [B, K, N]``, any strides.

    Transposed views (``weight.T``, ``k.transpose(-1, -2)``) are read in place.
    fp16/bf16 multiply on tensor cores, fp32 in IEEE fp32 (no TF32); all
    accumulate in fp32 and round once into ``out_dtype``.

    Args:
        a: ``[B, M, K]`` fp16, bf16 or fp32.
        b: ``[B, K, N]`` of ``a``'s dtype.
        out_dtype: result dtype (default ``a.dtype``; fp32 for attention scores).
        bias: optional ``[N]``, added in fp32 before rounding.

    Returns:
        ``[B, M, N]`` in ``out_dtype``.

    Raises:
        TypeError: unsupported or mismatched dtypes.
        ValueError: wrong ranks, inner or batch dims that differ, mixed devices.
    """
    _check_pair(a, b, ("a", "b"), 3)
    if a.shape[0] != b.shape[0]:
        raise ValueError(
            f"batch sizes differ: a {tuple(a.shape)} and b {tuple(b.shape)}; "
            f"expand the smaller one to match"
        )
    N = b.shape[2]
    _check_bias(bias, N, a.device)
    dtype = _out_dtype(a, out_dtype)
    B, M, K = a.shape
    if B == 0 or M == 0 or N == 0 or K == 0:
        out = torch.zeros(B, M, N, dtype=torch.float32, device=a.device)
        return (out + bias.float() if bias is not None else out).to(dtype)
    if select_backend(a.device) == "torch":
        return invariant_bmm_reference(a, b, dtype, bias)
    from specter_kernels.invariant.matmul_triton import launch_invariant_bmm

    out = torch.empty(B, M, N, dtype=dtype, device=a.device)
    return launch_invariant_bmm(a, b, out, bias)


def invariant_mm(
    a: torch.Tensor, b: torch.Tensor, out_dtype: torch.dtype | None = None
) -> torch.Tensor:
    """Batch-invariant ``a @ b`` for ``[M, K] x [K, N]`` (see :func:`invariant_bmm`).

    Raises:
        TypeError, ValueError: as :func:`invariant_bmm`.
    """
    _check_pair(a, b, ("a", "b"), 2)
    return invariant_bmm(a.unsqueeze(0), b.unsqueeze(0), out_dtype)[0]


def invariant_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    constant_weight: bool = False,
) -> torch.Tensor:
    """Batch-invariant ``F.linear``: ``x @ weight.T + bias`` with ``x [..., K]``, ``weight [N, K]``.

    The weight is read in place (no copy); the bias is added in fp32 before the single
    rounding to ``x.dtype``. On the GPU a weight with unit stride along K takes the invariant
    GEMV where :func:`~specter_kernels.invariant.gemv_config.gemv_config` gives it a tile
    (decode-sized linears), else the tensor-core kernel of :func:`invariant_bmm`.

    ``constant_weight=True`` promises that no kernel queued before this call writes
    ``weight`` (a model's parameter, not a tensor computed on the fly): the GEMV may then
    load it before its PDL wait, overlapping the kernel before it
    (:mod:`specter_kernels.pdl`). The result is the same
    either way.

    Returns:
        ``[..., N]`` in ``x.dtype``.

    Raises:
        TypeError, ValueError: bad ranks, shapes or dtypes (naming both shapes).
    """
    if not isinstance(x, torch.Tensor) or x.dim() < 1:
        raise ValueError(f"x must be a tensor [..., K], got {getattr(x, 'shape', x)}")
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ValueError(f"weight must be [N, K], got {getattr(weight, 'shape', weight)}")
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(
            f"x {tuple(x.shape)} has K={x.shape[-1]} but weight {tuple(weight.shape)} "
            f"has K={weight.shape[1]}"
        )
    if bias is not None and bias.dtype != x.dtype:
        raise TypeError(f"bias is {bias.dtype} but x is {x.dtype}; cast it")
    rows = x.reshape(-1, x.shape[-1])
    _check_pair(rows, weight.T, ("x", "weight.T"), 2)
    N, K = weight.shape
    _check_bias(bias, N, x.device)
    if rows.shape[0] and N and weight.stride(1) == 1 and select_backend(x.device) == "triton":
        # The GEMV where it applies (a weight's N is fixed, so a shape always takes one
        # kernel): the choice looks at (N, K, dtype) only, never at the row count. Matmuls
        # of runtime operands (attention's, whose N is the key count) keep the MMA kernel.
        from specter_kernels.invariant.gemv_config import gemv_config
        from specter_kernels.invariant.gemv_triton import launch_invariant_gemv
        from specter_kernels.invariant.matmul_triton import device_name

        config = gemv_config(N, K, x.dtype, device_name(x.device))
        if config is not None:
            out = torch.empty(rows.shape[0], N, dtype=x.dtype, device=x.device)
            launch_invariant_gemv(rows, weight, out, bias, config, preload=constant_weight)
            return out.reshape(*x.shape[:-1], N)
    out = invariant_bmm(rows.unsqueeze(0), weight.T.unsqueeze(0), None, bias)[0]
    return out.reshape(*x.shape[:-1], N)
