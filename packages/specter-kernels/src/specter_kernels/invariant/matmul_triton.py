"""Triton kernel of the batch-invariant matmul ``[B, M, K] x [B, K, N] -> [B, M, N]``.

Each program computes one ``[BLOCK_M, BLOCK_N]`` output tile of one batch entry
by walking its stretch of K in steps of BLOCK_K into one fp32 accumulator. The tile
shape and the split of K come from :func:`matmul_config`, which looks at (N, K, dtype)
only, so the reduction order of every output element is the same whatever M and B
are: a row's result does not depend on the rows beside it.

With ``split_k = S > 1`` (decode-sized GEMVs whose N alone gives too few programs to
stream the weight at full bandwidth) K is cut into S fixed stretches of
``k_split`` columns. Program ``s`` writes its fp32 partial sums to a workspace
``[B, S, M, N]``, then takes a ticket from its output tile's arrival counter; the
program that draws the last ticket (whichever split it is) adds the S partials in the
order 0, 1, ..., S-1, adds the bias, rounds once, and sets the counter back to zero for
the next launch. One launch, no reduction kernel and no memset: the counters live in a
per-device buffer (:func:`tile_counters`) that every split launch leaves zeroed. The
stretches and the summation order depend on (N, K, dtype) only, so split-K keeps the
kernel batch-invariant (unlike cuBLAS's split-K, chosen by M).

Launches on one stream run in order and share the device's counters. Launches that may run
at the same time as others (the shared experts on a side stream beside the routed ones)
take counters of their own for the block: ``with counters_in(split_counters(device)):``
(:func:`counters_in`), so two launches never draw tickets from one counter.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator

import torch
import triton
import triton.language as tl

from specter_kernels.invariant.matmul_config import MatmulConfig, matmul_config
from specter_kernels.pdl import pdl_enter, pdl_options


# M and the batch stride vary with the number of rows; specialising on them
# (Triton treats 1 and multiples of 16 specially) would compile a different
# kernel per row count, which is exactly what this kernel must not do.
@triton.jit(
    do_not_specialize=[
        "M", "stride_ab", "stride_am", "stride_cb", "stride_cm", "stride_wb", "stride_wm"
    ]
)  # fmt: skip
def _invariant_matmul_kernel(
    a_ptr,
    b_ptr,
    bias_ptr,
    c_ptr,
    w_ptr,
    counter_ptr,
    M,
    N,
    K,
    stride_ab,
    stride_am,
    stride_ak,
    stride_bb,
    stride_bk,
    stride_bn,
    stride_cb,
    stride_cm,
    stride_cn,
    stride_wb,
    stride_ws,
    stride_wm,
    k_split,
    HAS_BIAS: tl.constexpr,
    IEEE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    pdl_enter(PDL)  # first: with PDL, wait for the previous kernel
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1) // SPLIT_K
    split = tl.program_id(1) % SPLIT_K
    batch = tl.program_id(2).to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_mask = offs_m < M
    n_mask = offs_n < N
    mask = m_mask[:, None] & n_mask[None, :]
    a_rows = a_ptr + batch * stride_ab + offs_m.to(tl.int64)[:, None] * stride_am
    b_cols = b_ptr + batch * stride_bb + offs_n.to(tl.int64)[None, :] * stride_bn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    k_begin = split * k_split
    k_end = tl.minimum(k_begin + k_split, K)
    for k0 in range(k_begin, k_end, BLOCK_K):
        kk = k0 + offs_k
        k_mask = kk < k_end
        # Masked lanes load zeros, so K below 16 or not a multiple of BLOCK_K
        # (rotary's K=1) still feeds tl.dot a full tile.
        a = tl.load(
            a_rows + kk.to(tl.int64)[None, :] * stride_ak,
            mask=m_mask[:, None] & k_mask[None, :],
            other=0.0,
        )
        b = tl.load(
            b_cols + kk.to(tl.int64)[:, None] * stride_bk,
            mask=k_mask[:, None] & n_mask[None, :],
            other=0.0,
        )
        if IEEE:
            acc = tl.dot(a, b, acc, input_precision="ieee")  # fp32: no TF32 rounding
        else:
            acc = tl.dot(a, b, acc)
    c = c_ptr + batch * stride_cb + offs_m.to(tl.int64)[:, None] * stride_cm
    c = c + offs_n.to(tl.int64)[None, :] * stride_cn
    if SPLIT_K > 1:
        # w is the fp32 workspace [B, S, M, N] (N contiguous); stride_ws steps between
        # partials. Every thread's partial must be stored before the ticket is taken;
        # the ticket's acq_rel atomic publishes them to the program that draws the last.
        w = w_ptr + batch * stride_wb + offs_m.to(tl.int64)[:, None] * stride_wm
        w = w + offs_n.to(tl.int64)[None, :]
        tl.store(w + split * stride_ws, acc, mask=mask)
        tl.debug_barrier()
        tile = (batch * tl.num_programs(0) + pid_m) * tl.cdiv(N, BLOCK_N) + pid_n
        ticket = tl.atomic_add(counter_ptr + tile, 1, sem="acq_rel")
        if ticket == SPLIT_K - 1:
            # The last arrival sums the partials in split order, whoever it is, so the
            # bits do not depend on which program finished last.
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            for s in tl.static_range(SPLIT_K):
                acc += tl.load(w + s * stride_ws, mask=mask, other=0.0, cache_modifier=".cg")
            if HAS_BIAS:
                acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
            tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=mask)
            tl.atomic_xchg(counter_ptr + tile, 0)  # zeroed for the next launch
    else:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        tl.store(c, acc.to(c_ptr.dtype.element_ty), mask=mask)


COUNTER_FLOOR = 1 << 16
"""Arrival counters allocated per device at least (256 KB): every decode-sized split launch
fits, so the buffer is made once, outside any CUDA graph capture."""

_counters: dict[torch.device, torch.Tensor] = {}
_override = threading.local()  # .buffer: the counters of a counters_in block, else None


def split_counters(device: torch.device | str, tiles: int = COUNTER_FLOOR) -> torch.Tensor:
    """A new zeroed int32 counter buffer of at least ``tiles`` (and ``COUNTER_FLOOR``), for
    :func:`counters_in`. Make it outside any CUDA graph capture."""
    size = max(COUNTER_FLOOR, triton.next_power_of_2(tiles))
    return torch.zeros(size, dtype=torch.int32, device=device)


@contextlib.contextmanager
def counters_in(buffer: torch.Tensor) -> Iterator[None]:
    """Split launches on ``buffer``'s device inside the block use ``buffer`` (from
    :func:`split_counters`) instead of the device's counters: for launches that run at the
    same time as others (another stream's). Blocks nest; the host thread's own."""
    previous = getattr(_override, "buffer", None)
    _override.buffer = buffer
    try:
        yield
    finally:
        _override.buffer = previous


def tile_counters(device: torch.device, tiles: int) -> torch.Tensor:
    """The zeroed int32 arrival counters split launches on ``device`` use, at least ``tiles``:
    those of the enclosing :func:`counters_in` block, else the device's.

    Split launches leave every counter they use at zero, so one buffer serves every
    launch on the device (in stream order). The device's buffer is made (or grown) outside
    CUDA graph capture only: a buffer first zeroed inside a capture would hold garbage until
    the graph's first replay; a ``counters_in`` buffer never grows.

    Raises:
        RuntimeError: the buffer must be made or grown while a CUDA graph is captured;
            run the same launch once eagerly before capturing it.
    """
    if device.type == "cuda" and device.index is None:  # "cuda" names the current device
        device = torch.device("cuda", torch.cuda.current_device())
    own = getattr(_override, "buffer", None)
    if own is not None and own.device == device:
        if own.numel() < tiles:
            raise RuntimeError(
                f"the invariant matmul needs {tiles} split-K arrival counters, the "
                f"counters_in buffer has {own.numel()}; make it with split_counters(device, "
                f"{tiles})"
            )
        return own
    buffer = _counters.get(device)
    if buffer is not None and buffer.numel() >= tiles:
        return buffer
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            f"the invariant matmul needs {tiles} split-K arrival counters on {device} "
            f"(has {0 if buffer is None else buffer.numel()}) while a CUDA graph is being "
            "captured; run the same matmul once eagerly before capturing it"
        )
    _counters[device] = split_counters(device, tiles)
    return _counters[device]


@functools.cache
def device_name(device: torch.device) -> str | None:
    """The GPU model's name (tuned tiles are per model); None off CUDA."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else None


def launch_invariant_bmm(
    a: torch.Tensor,
    b: torch.Tensor,
    out: torch.Tensor,
    bias: torch.Tensor | None = None,
    config: MatmulConfig | None = None,
) -> torch.Tensor:
    """Run the kernel on validated ``a [B, M, K]``, ``b [B, K, N]`` into ``out [B, M, N]``."""
    B, M, K = a.shape
    N = b.shape[2]
    c = config or matmul_config(N, K, a.dtype, device_name(a.device))
    split = c.split_k if c.block_k < K else 1
    # Each stretch is a whole number of BLOCK_K steps, so a split only cuts where the
    # unsplit kernel's steps end; the last stretch may be shorter (or empty).
    k_split = triton.cdiv(triton.cdiv(K, split), c.block_k) * c.block_k
    grid = (triton.cdiv(M, c.block_m), triton.cdiv(N, c.block_n) * split, B)
    if split == 1:
        partials, counters, w_strides = out, out, (0, 0, 0)
    else:
        partials = torch.empty(B, split, M, N, dtype=torch.float32, device=a.device)
        counters = tile_counters(a.device, grid[0] * triton.cdiv(N, c.block_n) * B)
        w_strides = (partials.stride(0), partials.stride(1), partials.stride(2))
    _invariant_matmul_kernel[grid](
        a, b, bias if bias is not None else out, out, partials, counters,
        M, N, K,
        a.stride(0), a.stride(1), a.stride(2),
        b.stride(0), b.stride(1), b.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        *w_strides, k_split,
        HAS_BIAS=bias is not None, IEEE=a.dtype == torch.float32,
        BLOCK_M=c.block_m, BLOCK_N=c.block_n, BLOCK_K=c.block_k, SPLIT_K=split,
        num_warps=c.num_warps, num_stages=c.num_stages,
        **pdl_options(a.device),
    )  # fmt: skip
    return out
