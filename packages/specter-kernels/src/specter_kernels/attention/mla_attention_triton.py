"""Triton kernels of the absorbed MLA attention: chunked online softmax, then a merge.

``_mla_chunk_kernel``: one program per (query row, ``SPLIT``-position key chunk) holds all
heads' queries (``[BLOCK_H, R]`` and ``[BLOCK_H, P]``) and walks its chunk ``BLOCK_L``
keys at a time: ``tl.dot`` scores, mask, running max and sum, ``tl.dot`` of the fp16
probabilities with the latents into an fp32 ``[BLOCK_H, R]`` accumulator; it writes the
unnormalised accumulator, max and sum of its chunk. ``_mla_merge_kernel``: one program per
(row, head) rescales and adds the row's chunks (:data:`CHUNK_BLOCK` at a time) and divides
once.
``_mla_merge_project_kernel`` (``w_uv`` given): the same merge, then the value
up-projection ``o_lat @ W_UV[h]^T`` as fixed-order fp32 dot products, one program per
(``PROJECT_ROWS`` rows, head, ``BLOCK_V`` outputs).

Chunk boundaries are absolute key positions, so a row's chunks are the same whatever the
row count or window; fully masked chunks and blocks leave the running state bit for bit
unchanged (max of the old max and -inf, a factor of exp(0) = 1, zero probabilities).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specter_kernels.pdl import pdl_enter, pdl_options

SPLIT = 32
"""Key positions per chunk (a multiple of ``BLOCK_L``); it sets the result's bits (the
chunks' sums and their merge), never by row count. On an H200, DeepSeek-V2-Lite's attention
with the value projection took 8.7-14.0 us a layer for one row at 264-2100 keys with 32-key
chunks and the block merge, against 9.9-14.2 us with 64-key chunks merged one after another;
five rows take 1-8 us more at 512-2100 keys."""
BLOCK_L = 32
"""Keys per step of a chunk's walk (at most ``SPLIT``; ``tl.dot`` needs 16 or more)."""
NUM_WARPS = 8
PARTIAL_BYTES = 32 << 20
"""Most fp32 partial-accumulator bytes one launch uses; longer prompts go in row chunks."""
BLOCK_V = 16
"""``W_UV`` rows per program of the merge with the value projection."""
PROJECT_ROWS = 8
"""Query rows per program of the merge with the value projection (they share its ``W_UV``
tile, and walk their merges one after another) when a launch has more than
:data:`PARALLEL_ROWS` rows; up to that, one row per program, all in parallel (at 5 rows,
5 rows a program made the block 2.4 us slower than the separate ``bmm`` on an H200). A
row's bits are the same either way."""
PARALLEL_ROWS = 32
PROJECT_WARPS = 4
CHUNK_BLOCK = 8
"""Chunks a merge reads and adds at once (a ``[CHUNK_BLOCK, R]`` tile and one tree sum).
Fixed, never the window's chunk count: a row's chunks past the window or past its last
visible key add exact zeros in fixed places, so its bits do not depend on the window (batch
invariance)."""
NEG_BIG: tl.constexpr = tl.constexpr(-1.0e30)
"""The running max before any visible key (finite, so a masked block keeps exp(0) = 1)."""


@triton.jit(do_not_specialize=["L", "row0", "offset"])
def _mla_chunk_kernel(
    q_ptr, qpe_ptr, c_ptr, kpe_ptr, mask_ptr, acc_ptr, max_ptr, sum_ptr,
    H, L, R, P, row0, offset,
    s_qh, s_qt, s_ph, s_pt, s_cl, s_kl, s_mt, s_ml,
    scale,
    SPLIT: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_P: tl.constexpr, MASK_MODE: tl.constexpr,
    PDL: tl.constexpr = 0,
):  # fmt: skip
    pdl_enter(PDL)  # first: with PDL, wait for the previous kernel
    local = tl.program_id(0)
    t = row0 + local
    chunk = tl.program_id(1)
    chunks = tl.num_programs(1)
    heads = tl.arange(0, BLOCK_H)
    rr = tl.arange(0, BLOCK_R)
    pp = tl.arange(0, BLOCK_P)
    live_h = heads < H
    q = tl.load(
        q_ptr + heads[:, None] * s_qh + t * s_qt + rr[None, :],
        mask=live_h[:, None] & (rr[None, :] < R),
        other=0.0,
    )
    qp = tl.load(
        qpe_ptr + heads[:, None] * s_ph + t * s_pt + pp[None, :],
        mask=live_h[:, None] & (pp[None, :] < P),
        other=0.0,
    )
    run_max = tl.full([BLOCK_H], NEG_BIG, dtype=tl.float32)
    run_sum = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_R], dtype=tl.float32)
    start = chunk * SPLIT
    for l0 in range(start, start + SPLIT, BLOCK_L):
        keys = l0 + tl.arange(0, BLOCK_L)
        inside = keys < L
        c = tl.load(
            c_ptr + keys[:, None] * s_cl + rr[None, :],
            mask=inside[:, None] & (rr[None, :] < R),
            other=0.0,
        )
        kp = tl.load(
            kpe_ptr + keys[:, None] * s_kl + pp[None, :],
            mask=inside[:, None] & (pp[None, :] < P),
            other=0.0,
        )
        scores = tl.dot(q, tl.trans(c)) + tl.dot(qp, tl.trans(kp))
        scores = scores * scale
        visible = inside
        if MASK_MODE == 0:
            visible = visible & (keys <= t + offset)
        elif MASK_MODE == 1:
            m = tl.load(mask_ptr + t * s_mt + keys * s_ml, mask=inside, other=0)
            visible = visible & (m != 0)
        else:
            bias = tl.load(mask_ptr + t * s_mt + keys * s_ml, mask=inside, other=0.0)
            scores = scores + bias.to(tl.float32)[None, :]
        scores = tl.where(visible[None, :], scores, float("-inf"))
        new_max = tl.maximum(run_max, tl.max(scores, axis=1))
        factor = tl.exp(run_max - new_max)
        probs = tl.exp(scores - new_max[:, None])
        run_sum = run_sum * factor + tl.sum(probs, axis=1)
        acc = acc * factor[:, None] + tl.dot(probs.to(c.dtype), c)
        run_max = new_max
    part = local * chunks + chunk
    tl.store(
        acc_ptr + (part * BLOCK_H + heads[:, None]) * BLOCK_R + rr[None, :],
        acc,
    )
    tl.store(max_ptr + part * BLOCK_H + heads, run_max)
    tl.store(sum_ptr + part * BLOCK_H + heads, run_sum)


@triton.jit
def _merge_chunks(
    acc_ptr, max_ptr, sum_ptr, local, h, chunks, rr,
    BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr,
    CHUNK_BLOCK: tl.constexpr,
):  # fmt: skip
    """Row ``local``'s head ``h``: its chunks' accumulators rescaled to the peak max and
    added, divided once by the summed weights (zeros for a row with no visible key). fp32
    ``[BLOCK_R]``; both merge kernels run this, so they agree bit for bit.

    ``CHUNK_BLOCK`` chunks at a time: their maxima, sums and accumulators read as one tile
    each, added by a tree sum, the blocks then added in order (absent chunks read as max
    ``-inf`` and zeros, so they weigh 0 in the same places whatever the window)."""
    cc = tl.arange(0, CHUNK_BLOCK)
    base = local * chunks
    peak = tl.full([], float("-inf"), tl.float32)
    for c0 in range(0, chunks, CHUNK_BLOCK):
        m = tl.load(
            max_ptr + (base + c0 + cc) * BLOCK_H + h,
            mask=c0 + cc < chunks,
            other=float("-inf"),
        )
        peak = tl.maximum(peak, tl.max(m, axis=0))
    norm = tl.zeros([], dtype=tl.float32)
    total = tl.zeros([BLOCK_R], dtype=tl.float32)
    for c0 in range(0, chunks, CHUNK_BLOCK):
        live = c0 + cc < chunks
        part = (base + c0 + cc) * BLOCK_H + h
        w = tl.exp(tl.load(max_ptr + part, mask=live, other=float("-inf")) - peak)
        norm = norm + tl.sum(w * tl.load(sum_ptr + part, mask=live, other=0.0), axis=0)
        acc = tl.load(
            acc_ptr + part[:, None] * BLOCK_R + rr[None, :], mask=live[:, None], other=0.0
        )
        total = total + tl.sum(w[:, None] * acc, axis=0)
    return tl.where(norm > 0.0, total / tl.where(norm > 0.0, norm, 1.0), 0.0)


@triton.jit(do_not_specialize=["row0"])
def _mla_merge_kernel(
    acc_ptr, max_ptr, sum_ptr, out_ptr, R, row0, s_oh, s_ot, chunks,
    BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr, CHUNK_BLOCK: tl.constexpr,
    PDL: tl.constexpr = 0,
):  # fmt: skip
    pdl_enter(PDL)  # first: with PDL, wait for the previous kernel
    local = tl.program_id(0)
    h = tl.program_id(1)
    rr = tl.arange(0, BLOCK_R)
    out = _merge_chunks(
        acc_ptr, max_ptr, sum_ptr, local, h, chunks, rr, BLOCK_H, BLOCK_R, CHUNK_BLOCK
    )
    tl.store(
        out_ptr + h * s_oh + (row0 + local) * s_ot + rr,
        out.to(out_ptr.dtype.element_ty),
        mask=rr < R,
    )


@triton.jit(do_not_specialize=["row0", "rows"])
def _mla_merge_project_kernel(
    acc_ptr, max_ptr, sum_ptr, w_ptr, out_ptr, R, V, row0, rows, chunks,
    s_wh, s_wv, s_ot, s_oh,
    BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr,
    ROWS: tl.constexpr, CHUNK_BLOCK: tl.constexpr, PDL: tl.constexpr = 0,
):  # fmt: skip
    """``_mla_merge_kernel``'s merge of ``ROWS`` rows of head ``h``, each rounded to the
    output dtype as ``o_lat`` would be, then their dot products with ``W_UV[h]``'s rows
    ``vb * BLOCK_V ..`` (one ``[BLOCK_V, R]`` tile held for all of the program's rows)."""
    pdl_enter(PDL)  # first: with PDL, wait for the previous kernel
    first_row = tl.program_id(0) * ROWS
    h = tl.program_id(1)
    vv = tl.program_id(2) * BLOCK_V + tl.arange(0, BLOCK_V)
    rr = tl.arange(0, BLOCK_R)
    w = tl.load(
        w_ptr + h * s_wh + vv[:, None] * s_wv + rr[None, :],
        mask=(vv[:, None] < V) & (rr[None, :] < R),
        other=0.0,
    ).to(tl.float32)
    for i in range(0, tl.minimum(ROWS, rows - first_row)):
        local = first_row + i
        o_lat = _merge_chunks(
            acc_ptr, max_ptr, sum_ptr, local, h, chunks, rr, BLOCK_H, BLOCK_R, CHUNK_BLOCK
        )
        o_lat = o_lat.to(out_ptr.dtype.element_ty).to(tl.float32)  # o_lat's rounding
        out = tl.sum(w * o_lat[None, :], axis=1)
        tl.store(
            out_ptr + (row0 + local) * s_ot + h * s_oh + vv,
            out.to(out_ptr.dtype.element_ty),
            mask=vv < V,
        )


def launch_mla_attention(
    q_lat: torch.Tensor,
    q_pe: torch.Tensor,
    c_kv: torch.Tensor,
    k_pe: torch.Tensor,
    scale: float,
    mask: torch.Tensor | None,
    w_uv: torch.Tensor | None = None,
) -> torch.Tensor:
    """``o_lat [H, T, R]``, or with ``w_uv [H, V, R]`` (unit stride along R) the projected
    ``out [T, H, V]`` (arguments checked by ``mla_attention``; ``c_kv``/``k_pe`` with unit
    stride along their last dim)."""
    H, T, R = q_lat.shape
    L, P = k_pe.shape
    block_h = max(16, triton.next_power_of_2(H))
    block_r = max(16, triton.next_power_of_2(R))
    block_p = max(16, triton.next_power_of_2(P))
    chunks = triton.cdiv(L, SPLIT)
    if mask is None:
        mode, mask_arg, s_mt, s_ml = 0, q_lat, 0, 0
    else:
        mode = 1 if mask.dtype == torch.bool else 2
        mask_arg = mask.view(torch.uint8) if mask.dtype == torch.bool else mask
        s_mt, s_ml = mask.stride(0), mask.stride(1)
    if w_uv is None:
        out = torch.empty(H, T, R, dtype=q_lat.dtype, device=q_lat.device)
    else:
        V = w_uv.shape[1]
        out = torch.empty(T, H, V, dtype=q_lat.dtype, device=q_lat.device)
    rows_per_launch = max(1, min(T, PARTIAL_BYTES // (chunks * block_h * block_r * 4)))
    acc = torch.empty(rows_per_launch * chunks * block_h * block_r, dtype=torch.float32,
                      device=q_lat.device)  # fmt: skip
    run_max = torch.empty(rows_per_launch * chunks * block_h, dtype=torch.float32,
                          device=q_lat.device)  # fmt: skip
    run_sum = torch.empty_like(run_max)
    for row0 in range(0, T, rows_per_launch):
        rows = min(rows_per_launch, T - row0)
        _mla_chunk_kernel[(rows, chunks)](
            q_lat, q_pe, c_kv, k_pe, mask_arg, acc, run_max, run_sum,
            H, L, R, P, row0, L - T,
            q_lat.stride(0), q_lat.stride(1), q_pe.stride(0), q_pe.stride(1),
            c_kv.stride(0), k_pe.stride(0), s_mt, s_ml,
            scale,
            SPLIT=SPLIT, BLOCK_L=min(BLOCK_L, SPLIT),
            BLOCK_H=block_h, BLOCK_R=block_r, BLOCK_P=block_p,
            MASK_MODE=mode, num_warps=NUM_WARPS,
            **pdl_options(q_lat.device, early_trigger=True),
        )  # fmt: skip
        if w_uv is None:
            _mla_merge_kernel[(rows, H)](
                acc, run_max, run_sum, out, R, row0, out.stride(0), out.stride(1), chunks,
                BLOCK_H=block_h, BLOCK_R=block_r, CHUNK_BLOCK=CHUNK_BLOCK, num_warps=4,
                **pdl_options(out.device, early_trigger=True),
            )  # fmt: skip
            continue
        group = 1 if T <= PARALLEL_ROWS else PROJECT_ROWS
        _mla_merge_project_kernel[(triton.cdiv(rows, group), H, triton.cdiv(V, BLOCK_V))](
            acc, run_max, run_sum, w_uv, out, R, V, row0, rows, chunks,
            w_uv.stride(0), w_uv.stride(1), out.stride(0), out.stride(1),
            BLOCK_H=block_h, BLOCK_R=block_r, BLOCK_V=BLOCK_V, ROWS=group, CHUNK_BLOCK=CHUNK_BLOCK,
            num_warps=PROJECT_WARPS,
            **pdl_options(out.device, early_trigger=True),
        )  # fmt: skip
    return out
