"""Triton kernel of the batch-invariant skinny linear ``x [M, K] @ weight[N, K]^T -> [M, N]``.

The decode and verification linears have one to a few dozen rows and a weight of megabytes:
their time is the weight's bytes, and the tensor-core kernel of
:mod:`specter_kernels.invariant.matmul_triton` (a 16-row MMA tile, K split across programs
and summed by the last arrival) reaches about a third of an H200's bandwidth on them. This
kernel is a GEMV instead:

* one program owns ``BLOCK_N`` output columns and all of K: it loads its ``[BLOCK_N, K]``
  stretch of the weight once, in one go (every load in flight at once, no K loop, no split,
  no workspace), into registers as fp32;
* then it takes the M rows in passes of ``ROWS`` (unrolled, so a pass's row loads are in
  flight together): for each row it multiplies elementwise, sums along K with one
  ``tl.sum``, adds the bias and rounds once.

Batch invariance is by construction: M is a runtime loop bound (never specialised), so every
row count runs the same binary; row m is always the ``m % ROWS``-th of its pass, and each
row goes through the same instructions whatever the rows beside it. The tile (``BLOCK_N``,
``BLOCK_K = next_pow2(K)``, warps, ``ROWS``) depends on (N, K, dtype) only
(:mod:`specter_kernels.invariant.gemv_config`).

With ``PRELOAD`` (a caller's ``preload=True`` for a weight no earlier kernel writes) the
weight's loads are issued before the PDL wait: they do not depend on the previous kernel.
Behind a small kernel that lets its successor launch early (:mod:`specter_kernels.pdl`) they
stream while that kernel runs. Behind a kernel that only waits they gain nothing (measured on
an H200).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specter_kernels.invariant.gemv_config import InvariantGemvConfig
from specter_kernels.pdl import pdl_enter, pdl_options


@triton.jit(do_not_specialize=["M", "stride_xm", "stride_om"])
def _invariant_gemv_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    HAS_BIAS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    ROWS: tl.constexpr,
    PRELOAD: tl.constexpr = 0,
    PDL: tl.constexpr = 0,
):
    if not PRELOAD:
        pdl_enter(PDL)  # first: with PDL, wait for the previous kernel
    pid = tl.program_id(0)
    offs_n = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    n_mask = offs_n < N
    k_mask = offs_k < K
    w_ptrs = w_ptr + offs_n.to(tl.int64)[:, None] * stride_wn + offs_k[None, :]
    w = tl.load(w_ptrs, mask=n_mask[:, None] & k_mask[None, :], other=0.0)
    if PRELOAD:
        # The caller promised the weight constant (no earlier kernel writes it): its loads
        # may be in flight while the kernel before runs, when that one triggered early.
        pdl_enter(PDL)
    w = w.to(tl.float32)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    # Rows go in passes of ROWS, unrolled, so a pass's row loads are in flight together.
    # Row m is always the (m % ROWS)-th of its pass, whatever M, and every row runs the
    # same instructions: the passes cannot make a row's bits depend on the row count.
    for m0 in range(0, M, ROWS):
        for r in tl.static_range(ROWS):
            m = m0 + r
            live = m < M
            row = tl.multiple_of(m * stride_xm, 8)  # the launcher's contract: 16-byte rows
            x = tl.load(x_ptr + row + offs_k, mask=k_mask & live, other=0.0).to(tl.float32)
            acc = tl.sum(w * x[None, :], axis=1)
            if HAS_BIAS:
                acc += bias
            out = out_ptr + m * stride_om + offs_n
            tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=n_mask & live)


def launch_invariant_gemv(
    x: torch.Tensor,
    weight: torch.Tensor,
    out: torch.Tensor,
    bias: torch.Tensor | None,
    config: InvariantGemvConfig,
    preload: bool = False,
) -> torch.Tensor:
    """Run the kernel: ``x [M, K]``, ``weight [N, K]`` (unit stride along K), ``out [M, N]``
    (unit stride along N), optional ``bias [N]``; returns ``out``.

    ``preload``: the caller promises no earlier kernel writes ``weight``, so its loads may be
    issued before the PDL wait.

    ``x`` is copied first when its rows are not 16-byte aligned (the kernel's vector loads
    assume it), so every call of a shape runs one binary whatever ``x``'s layout.
    """
    M, K = x.shape
    N = weight.shape[0]
    if x.stride(-1) != 1 or x.stride(0) % 8 or x.data_ptr() % 16:
        x = x.clone(memory_format=torch.contiguous_format)
        if x.data_ptr() % 16:  # a clone is a fresh, aligned allocation
            raise RuntimeError(f"x at {x.data_ptr():#x} is not 16-byte aligned after a copy")
    _invariant_gemv_kernel[(triton.cdiv(N, config.block_n),)](
        x, weight, bias if bias is not None else out, out,
        M, N, K, x.stride(0), weight.stride(0), out.stride(0),
        HAS_BIAS=bias is not None, BLOCK_N=config.block_n,
        BLOCK_K=triton.next_power_of_2(K), ROWS=config.rows,
        PRELOAD=int(preload),
        num_warps=config.num_warps, num_stages=1, **pdl_options(x.device),
    )  # fmt: skip
    return out
