"""``BatchInvariantMode``: route torch calls to batch-invariant implementations, scoped.

Inside ``with BatchInvariantMode():`` (or ``with batch_invariant():``) the calls
below, on CUDA tensors (and CPU tensors), give each row the same bits whatever
the number of rows computed together. It is a
:class:`torch.overrides.TorchFunctionMode`: nothing is registered globally, it
nests with other modes, and leaving the block restores torch's own kernels.

=====================================================  =========================================
call                                                   why torch's kernel is not row-invariant
=====================================================  =========================================
``F.linear``, ``torch.matmul``/``@``, ``mm``, ``bmm``,  cuBLAS(Lt) picks tile, split-K and stream-K
``addmm``                                              per (M, N, K): the row count changes the
                                                       reduction order
``sum``/``mean`` over the last dim                     the reduction kernel's block/vectorisation
                                                       and split across blocks follow the row count
``softmax``/``log_softmax`` over the last dim          per-warp vs per-block kernels by row count
``F.layer_norm``, ``F.rms_norm``                       same launch heuristics as the reductions
``F.scaled_dot_product_attention``                     flash/efficient kernels tile and split the
                                                       keys by T and batch size (split-KV decode)
=====================================================  =========================================

Everything else (and these calls with arguments they do not cover: other dims,
integer dtypes, ``out=``, dropout, devices other than CPU/CUDA) passes through
to torch unchanged. Elementwise ops need no cover: each element is computed
alone. On CUDA the Triton kernels run; on CPU the row-at-a-time torch
references (or the kernels under ``TRITON_INTERPRET=1`` with backend triton).

The Triton kernels have no backward: under the mode, a covered call on inputs
that need a gradient raises. Use it under ``torch.no_grad()``/``inference_mode``.

Example:
    >>> import torch, torch.nn.functional as F, specter_kernels as sk
    >>> x, w = torch.randn(4, 32), torch.randn(16, 32)
    >>> with sk.batch_invariant():
    ...     y = F.linear(x, w)
    >>> torch.equal(y, sk.invariant_linear(x, w))
    True
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from specter_kernels.invariant.attention import invariant_attention
from specter_kernels.invariant.matmul import invariant_bmm, invariant_linear
from specter_kernels.invariant.reductions import (
    invariant_layer_norm,
    invariant_log_softmax,
    invariant_mean,
    invariant_rms_norm,
    invariant_row_sum,
    invariant_softmax,
)

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _covered(*tensors) -> bool:
    """Whether every tensor is a float tensor of a supported dtype on CPU/CUDA."""
    for t in tensors:
        if t is None:
            continue
        if not isinstance(t, torch.Tensor) or t.dtype not in _DTYPES:
            return False
        if t.device.type not in ("cpu", "cuda"):
            return False
    return True


def _no_grad_needed(*tensors) -> None:
    if torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in tensors
    ):
        raise RuntimeError(
            "BatchInvariantMode covers inference only (its kernels have no backward), but an "
            "input requires grad; run the forward under torch.no_grad() or torch.inference_mode()"
        )


def _same_dtype_and_device(*tensors) -> bool:
    present = [t for t in tensors if t is not None]
    return all(t.dtype == present[0].dtype and t.device == present[0].device for t in present)


def _matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch.matmul`` semantics (1-d operands, broadcast batch dims) on invariant kernels."""
    squeeze_rows = a.dim() == 1
    squeeze_cols = b.dim() == 1
    a2 = a.unsqueeze(0) if squeeze_rows else a
    b2 = b.unsqueeze(-1) if squeeze_cols else b
    K = a2.shape[-1]
    if b2.dim() == 2:  # a weight: every leading dim of a is a row
        out = invariant_bmm(a2.reshape(1, -1, K), b2.unsqueeze(0))[0]
        out = out.reshape(*a2.shape[:-1], b2.shape[-1])
    else:
        batch = torch.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
        a3 = a2.expand(*batch, *a2.shape[-2:]).reshape(-1, *a2.shape[-2:])
        b3 = b2.expand(*batch, *b2.shape[-2:]).reshape(-1, *b2.shape[-2:])
        out = invariant_bmm(a3, b3).reshape(*batch, a2.shape[-2], b2.shape[-1])
    if squeeze_rows:
        out = out.squeeze(-2)
    if squeeze_cols:
        out = out.squeeze(-1)
    return out


def _matmul_handler(a, b, *, out=None):
    if out is not None or not _covered(a, b) or not _same_dtype_and_device(a, b):
        return NotImplemented
    if a.dim() == 0 or b.dim() == 0:
        return NotImplemented
    _no_grad_needed(a, b)
    return _matmul(a, b)


def _rmatmul_handler(self, other):
    return _matmul_handler(other, self)


def _mm_handler(a, b, *, out=None, **kwargs):
    if out is not None or kwargs or not _covered(a, b) or not _same_dtype_and_device(a, b):
        return NotImplemented
    if a.dim() != 2 or b.dim() != 2:
        return NotImplemented
    _no_grad_needed(a, b)
    return invariant_bmm(a.unsqueeze(0), b.unsqueeze(0))[0]


def _bmm_handler(a, b, *, out=None, **kwargs):
    if out is not None or kwargs or not _covered(a, b) or not _same_dtype_and_device(a, b):
        return NotImplemented
    if a.dim() != 3 or b.dim() != 3:
        return NotImplemented
    _no_grad_needed(a, b)
    return invariant_bmm(a, b)


def _addmm_handler(bias, a, b, *, beta=1, alpha=1, out=None, **kwargs):
    if out is not None or kwargs or not _covered(bias, a, b) or not _same_dtype_and_device(a, b):
        return NotImplemented
    if a.dim() != 2 or b.dim() != 2 or bias.dtype != a.dtype:
        return NotImplemented
    _no_grad_needed(bias, a, b)
    product = invariant_bmm(a.unsqueeze(0), b.unsqueeze(0), out_dtype=torch.float32)[0]
    return (beta * bias.float() + alpha * product).to(a.dtype)


def _linear_handler(input, weight, bias=None):
    if not _covered(input, weight, bias) or not _same_dtype_and_device(input, weight, bias):
        return NotImplemented
    if weight.dim() != 2 or input.dim() < 1:
        return NotImplemented
    _no_grad_needed(input, weight, bias)
    return invariant_linear(input, weight, bias)


def _last_dim_only(x: torch.Tensor, dim) -> bool:
    if dim is None or x.dim() == 0:
        return False
    dims = list(dim) if isinstance(dim, (list, tuple)) else [dim]
    return len(dims) == 1 and isinstance(dims[0], int) and dims[0] in (-1, x.dim() - 1)


def _reduction_handler(kind: str) -> Callable:
    def handler(input, dim=None, keepdim=False, *, dtype=None, out=None):
        if out is not None or not _covered(input) or not _last_dim_only(input, dim):
            return NotImplemented
        if dtype is not None and dtype not in _DTYPES:
            return NotImplemented
        _no_grad_needed(input)
        if kind == "mean":
            return invariant_mean(input, keepdim=keepdim, dtype=dtype)
        result_dtype = dtype or input.dtype
        total = invariant_row_sum(input.to(result_dtype), dtype=result_dtype)
        return total.unsqueeze(-1) if keepdim else total

    return handler


def _softmax_handler(log: bool) -> Callable:
    def handler(input, dim=None, _stacklevel=3, dtype=None, **kwargs):
        if kwargs or not _covered(input) or not _last_dim_only(input, dim):
            return NotImplemented
        if dtype is not None and dtype not in _DTYPES:
            return NotImplemented
        _no_grad_needed(input)
        fn = invariant_log_softmax if log else invariant_softmax
        return fn(input, -1, dtype)

    return handler


def _tensor_softmax_handler(log: bool) -> Callable:
    inner = _softmax_handler(log)

    def handler(self, dim, dtype=None):
        return inner(self, dim, dtype=dtype)

    return handler


def _layer_norm_handler(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not _covered(input, weight, bias) or input.dim() == 0 or shape != (input.shape[-1],):
        return NotImplemented
    _no_grad_needed(input, weight, bias)
    return invariant_layer_norm(input, shape, weight, bias, eps)


def _rms_norm_handler(input, normalized_shape, weight=None, eps=None):
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not _covered(input, weight) or input.dim() == 0 or shape != (input.shape[-1],):
        return NotImplemented
    _no_grad_needed(input, weight)
    return invariant_rms_norm(input, shape, weight, eps)


def _sdpa_handler(
    query,
    key,
    value,
    attn_mask=None,
    dropout_p=0.0,
    is_causal=False,
    scale=None,
    enable_gqa=False,
):
    if dropout_p != 0.0 or not _covered(query, key, value):
        return NotImplemented
    if not _same_dtype_and_device(query, key, value) or query.dim() != 4:
        return NotImplemented
    if key.dim() != 4 or value.dim() != 4:
        return NotImplemented
    if attn_mask is not None and not isinstance(attn_mask, torch.Tensor):
        return NotImplemented
    _no_grad_needed(query, key, value)
    return invariant_attention(query, key, value, attn_mask, is_causal, scale, enable_gqa)


def _handlers() -> dict[Callable, Callable]:
    sum_handler, mean_handler = _reduction_handler("sum"), _reduction_handler("mean")
    table = {
        F.linear: _linear_handler,
        torch.matmul: _matmul_handler,
        torch.Tensor.matmul: _matmul_handler,
        torch.Tensor.__matmul__: _matmul_handler,
        torch.Tensor.__rmatmul__: _rmatmul_handler,
        torch.mm: _mm_handler,
        torch.Tensor.mm: _mm_handler,
        torch.bmm: _bmm_handler,
        torch.Tensor.bmm: _bmm_handler,
        torch.addmm: _addmm_handler,
        torch.Tensor.addmm: _addmm_handler,
        torch.mean: mean_handler,
        torch.Tensor.mean: mean_handler,
        torch.sum: sum_handler,
        torch.Tensor.sum: sum_handler,
        F.softmax: _softmax_handler(log=False),
        torch.softmax: _softmax_handler(log=False),
        torch.Tensor.softmax: _tensor_softmax_handler(log=False),
        F.log_softmax: _softmax_handler(log=True),
        torch.log_softmax: _softmax_handler(log=True),
        torch.Tensor.log_softmax: _tensor_softmax_handler(log=True),
        F.layer_norm: _layer_norm_handler,
        F.rms_norm: _rms_norm_handler,
        F.scaled_dot_product_attention: _sdpa_handler,
    }
    return table


COVERED_CALLS: dict[Callable, Callable] = _handlers()


class BatchInvariantMode(TorchFunctionMode):
    """A scoped torch-function mode that makes the covered calls batch-invariant.

    See the module docstring for the covered calls and why each needs cover.
    Torch disables the mode while its handler runs, so the invariant
    implementations' own torch calls are not routed again.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        handler = COVERED_CALLS.get(func)
        if handler is not None:
            try:
                result = handler(*args, **kwargs)
            except TypeError as error:
                # An argument form the handler does not parse (e.g. torch's
                # overload with names): let torch handle it unchanged.
                if "argument" not in str(error):
                    raise
                result = NotImplemented
            if result is not NotImplemented:
                return result
        return func(*args, **kwargs)


@contextlib.contextmanager
def batch_invariant() -> Iterator[BatchInvariantMode]:
    """``with batch_invariant():`` enters a :class:`BatchInvariantMode` for the block."""
    with BatchInvariantMode() as mode:
        yield mode
