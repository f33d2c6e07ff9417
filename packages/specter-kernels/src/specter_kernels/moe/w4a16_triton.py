"""The fused W4A16 routed-expert layer on Triton: tile configs, workspaces and launchers (the
kernels are in :mod:`~specter_kernels.moe.w4a16_gemv_kernels` and
:mod:`~specter_kernels.moe.w4a16_tile_kernels`).

Per layer two launches whatever T (plus a memset when gate_up is split over K):
gate_up (SiLU-and-mul fused into its epilogue) writes ``h [T*k, I]`` fp16, then
down multiplies by the routing weight and sums each token's experts into
``out [T, H]`` fp16. Both projections split K over several programs: at decode a
program's serial chain of dependent loads, not bandwidth, sets the time, so
short K ranges and many resident programs keep enough bytes in flight. Partial
sums meet in an fp32 workspace; the last arriving program of an output tile
finishes it (``int4_triton.finish_gate_up`` / ``accumulate_rows_and_finish``).
An unsplit gate_up launch zeroes the down launch's workspace itself.

Two ways to map work onto programs:

* ``gemv``: one program per (routed pair, N-block, K-split); no alignment launch,
  no padded rows, CUDA-core FMAs. Best at decode (few pairs): every weight byte a
  pair needs is read once, by one program.
* ``tile``: pairs sorted by expert (``moe_align_block_size``) into blocks of
  BLOCK_M rows; one program per (block, N-block, K-split) multiplies on tensor
  cores (``tl.dot``, every dot dim >= 16). Reads each expert once per block, so it
  wins once tokens share experts (prefill, long verification).

Grids come from host-known sizes (T, k, E), never from device values.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from specter_kernels.moe.align import max_aligned_blocks, moe_align_block_size
from specter_kernels.moe.w4a16_gemv_kernels import _gemv_down_kernel, _gemv_gate_up_kernel
from specter_kernels.moe.w4a16_tile_kernels import _tile_down_kernel, _tile_gate_up_kernel
from specter_kernels.pdl import pdl_options
from specter_kernels.quant.int4_weight import Int4Weight


@dataclass(frozen=True)
class GemvConfig:
    """Tile shape of one gemv-path launch.

    Attributes:
        block_n: outputs per program (gate_up: per half, so it reads 2x block_n columns).
        block_k: inputs per loop step; a multiple of 8 (block_k / 8 word rows).
        split_k: programs sharing one output tile's K range.
        num_warps: warps per program.
        num_stages: software-pipelining depth.
        math: inner-loop arithmetic, see ``_gemv_step`` (0 fp16, 1 fp32 magic, 2 dot,
            3 packed f16x2).
    """

    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 2
    math: int = 0


@dataclass(frozen=True)
class TileConfig:
    """Tile shape of one tensor-core-path launch.

    Attributes:
        block_m: routed pairs per block (the alignment's block size), >= 16.
        block_n: outputs per program, >= 16.
        block_k: inputs per loop step; block_k / 8 >= 16 because each of the eight
            nibble slices is one ``tl.dot`` of depth block_k / 8.
        split_k: programs sharing one output tile's K range.
        num_warps: warps per program.
        num_stages: software-pipelining depth.
    """

    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 2


def _k_per_split(K: int, block_k: int, split_k: int) -> tuple[int, int]:
    """K range per split, a multiple of block_k, and the number of non-empty splits."""
    per_split = triton.cdiv(triton.cdiv(K, split_k), block_k) * block_k
    return per_split, triton.cdiv(K, per_split)


def _zeros_arg(w: Int4Weight) -> torch.Tensor:
    # Symmetric weights pass the scales as a never-read stand-in pointer.
    return w.zeros if w.zeros is not None else w.scales


@dataclass
class _Workspace:
    """Zeroed fp32 partial sums and int32 arrival counters of one layer call."""

    gate_up: torch.Tensor  # fp32 [pairs, 2I] (empty when gate_up is not split)
    gate_up_counters: torch.Tensor  # int32 [pairs, N-blocks of gate_up]
    down: torch.Tensor  # fp32 [T, H]
    down_counters: torch.Tensor  # int32 [T, N-blocks of down]


ZERO_BLOCK = 256


def _workspace(
    T: int, H: int, I: int, pairs: int, nb_gate_up: int, nb_down: int, split_gate_up: bool, device
) -> _Workspace:
    """One allocation carved into the four workspaces.

    Split gate_up: zeroed here (one memset). Otherwise it holds only the down
    workspace, left for the gate_up kernel to zero.
    """
    gu = pairs * 2 * I if split_gate_up else 0
    gu_cnt = pairs * nb_gate_up if split_gate_up else 0
    down, down_cnt = T * H, T * nb_down
    alloc = torch.zeros if split_gate_up else torch.empty
    words = alloc(gu + down + gu_cnt + down_cnt, dtype=torch.int32, device=device)
    floats = words[: gu + down].view(torch.float32)  # all-zero bits are 0.0
    counters = words[gu + down :]
    return _Workspace(floats[:gu], counters[:gu_cnt], floats[gu:], counters[gu_cnt:])


def launch_gemv(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: Int4Weight,
    w2: Int4Weight,
    gate_up_config: GemvConfig,
    down_config: GemvConfig,
) -> torch.Tensor:
    """The gemv path (arguments as in ``fused_moe_w4a16``, validated there)."""
    T, H = x.shape
    top_k = topk_ids.shape[1]
    I = w2.in_features
    pairs = T * top_k
    device = x.device
    ids = topk_ids.reshape(-1)
    cu, cd = gate_up_config, down_config
    for c in (cu, cd):
        if c.math not in (0, 1, 2, 3):
            raise ValueError(f"math must be 0, 1, 2 or 3, got {c.math} in {c}")
        if c.math == 2 and (c.block_k < 128 or c.block_n < 16):
            raise ValueError(f"math=2 (tl.dot) needs block_k >= 128 and block_n >= 16, got {c}")
    asm = int(device.type == "cuda")  # math 3's PTX; the interpreter runs Triton ops
    gu_per_split, gu_splits = _k_per_split(H, cu.block_k, cu.split_k)
    dn_per_split, dn_splits = _k_per_split(I, cd.block_k, cd.split_k)
    nb_gu, nb_dn = triton.cdiv(I, cu.block_n), triton.cdiv(H, cd.block_n)
    ws = _workspace(T, H, I, pairs, nb_gu, nb_dn, gu_splits > 1, device)
    h = torch.empty(pairs, I, dtype=torch.float16, device=device)
    out = torch.empty(T, H, dtype=torch.float16, device=device)
    _gemv_gate_up_kernel[(pairs, nb_gu, gu_splits)](
        x, ids, w13.qweight, w13.scales, _zeros_arg(w13), h, ws.gate_up, ws.gate_up_counters,
        ws.down, ws.down_counters, ws.down.numel(), ws.down_counters.numel(),
        H, I, top_k, gu_per_split, gu_splits,
        x.stride(0), w13.qweight.stride(0), w13.qweight.stride(1),
        w13.scales.stride(0), w13.scales.stride(1), h.stride(0),
        GROUP=w13.group_size, BLOCK_N=cu.block_n, BLOCK_K=cu.block_k,
        HAS_ZEROS=w13.zeros is not None, MATH=cu.math, SPLIT=gu_splits > 1, ZERO_BLOCK=ZERO_BLOCK,
        ASM=asm, num_warps=cu.num_warps, num_stages=cu.num_stages,
        **pdl_options(x.device),
    )  # fmt: skip
    _gemv_down_kernel[(pairs, nb_dn, dn_splits)](
        h, ids, topk_weights.reshape(-1), w2.qweight, w2.scales, _zeros_arg(w2),
        ws.down, ws.down_counters, out,
        I, H, top_k, dn_per_split, top_k * dn_splits,
        h.stride(0), w2.qweight.stride(0), w2.qweight.stride(1),
        w2.scales.stride(0), w2.scales.stride(1), out.stride(0),
        GROUP=w2.group_size, BLOCK_N=cd.block_n, BLOCK_K=cd.block_k,
        HAS_ZEROS=w2.zeros is not None, MATH=cd.math,
        ASM=asm, num_warps=cd.num_warps, num_stages=cd.num_stages,
        **pdl_options(h.device),
    )  # fmt: skip
    return out


def launch_tile(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: Int4Weight,
    w2: Int4Weight,
    gate_up_config: TileConfig,
    down_config: TileConfig,
) -> torch.Tensor:
    """The tensor-core path (arguments as in ``fused_moe_w4a16``, validated there).

    Both launches share one alignment, so their block_m must be equal.
    """
    cu, cd = gate_up_config, down_config
    if cu.block_m != cd.block_m:
        raise ValueError(
            f"gate_up and down tile configs must share block_m, got {cu.block_m} and {cd.block_m}"
        )
    for c in (cu, cd):
        if c.block_k < 128 or c.block_n < 16 or c.block_m < 16:
            raise ValueError(f"tile configs need block_k >= 128 and block_m, block_n >= 16: {c}")
    T, H = x.shape
    top_k = topk_ids.shape[1]
    I = w2.in_features
    E = w13.num_experts
    pairs = T * top_k
    device = x.device
    # Skipped pairs (-1) go into expert 0's blocks so that they still arrive; the gate_up
    # kernel zeroes their activations (a row of zeros in h, nothing added to out).
    aligned = topk_ids.clamp_min(0)
    sorted_ids, expert_ids, num_post_padded = moe_align_block_size(aligned, E, cu.block_m)
    max_blocks = max_aligned_blocks(pairs, E, cu.block_m)
    gu_per_split, gu_splits = _k_per_split(H, cu.block_k, cu.split_k)
    dn_per_split, dn_splits = _k_per_split(I, cd.block_k, cd.split_k)
    nb_gu, nb_dn = triton.cdiv(I, cu.block_n), triton.cdiv(H, cd.block_n)
    ws = _workspace(T, H, I, pairs, nb_gu, nb_dn, gu_splits > 1, device)
    h = torch.empty(pairs, I, dtype=torch.float16, device=device)
    out = torch.empty(T, H, dtype=torch.float16, device=device)
    _tile_gate_up_kernel[(max_blocks, nb_gu, gu_splits)](
        x, topk_ids.reshape(-1), sorted_ids, expert_ids, num_post_padded,
        w13.qweight, w13.scales, _zeros_arg(w13), h, ws.gate_up, ws.gate_up_counters,
        ws.down, ws.down_counters, ws.down.numel(), ws.down_counters.numel(),
        H, I, top_k, pairs, gu_per_split, gu_splits,
        x.stride(0), w13.qweight.stride(0), w13.qweight.stride(1),
        w13.scales.stride(0), w13.scales.stride(1), h.stride(0),
        GROUP=w13.group_size, BLOCK_M=cu.block_m, BLOCK_N=cu.block_n, BLOCK_K=cu.block_k,
        HAS_ZEROS=w13.zeros is not None, SPLIT=gu_splits > 1, ZERO_BLOCK=ZERO_BLOCK,
        num_warps=cu.num_warps, num_stages=cu.num_stages,
        **pdl_options(x.device),
    )  # fmt: skip
    _tile_down_kernel[(max_blocks, nb_dn, dn_splits)](
        h, sorted_ids, expert_ids, num_post_padded, topk_weights.reshape(-1),
        w2.qweight, w2.scales, _zeros_arg(w2), ws.down, ws.down_counters, out,
        I, H, top_k, pairs, dn_per_split, top_k * dn_splits,
        h.stride(0), w2.qweight.stride(0), w2.qweight.stride(1),
        w2.scales.stride(0), w2.scales.stride(1), out.stride(0),
        GROUP=w2.group_size, BLOCK_M=cd.block_m, BLOCK_N=cd.block_n, BLOCK_K=cd.block_k,
        HAS_ZEROS=w2.zeros is not None,
        num_warps=cd.num_warps, num_stages=cd.num_stages,
        **pdl_options(h.device),
    )  # fmt: skip
    return out
