"""Tile shapes of the W4A16 kernels, chosen per problem size.

Chosen from sweeps on one H200 (``scripts/bench_kernels.py --sweep``; see
docs/benchmarks-kernels.md). At decode the time is set by each program's chain of
dependent loads, so K is split until there are enough short programs to keep
every SM's memory pipe busy. Under the Triton interpreter (CPU tests) small
fixed shapes keep the tests fast while still exercising split-K, masking and
every ``tl.dot`` dim >= 16.
"""

from __future__ import annotations

import torch
import triton

from specter_kernels.w4a16_triton import GemvConfig, TileConfig

# Programs to aim for per launch (132 SMs on an H200, several resident per SM).
GATE_UP_TARGET_PROGRAMS = 2048
DOWN_TARGET_PROGRAMS = 1024


def _split_k(programs_without_split: int, K: int, block_k: int, target: int) -> int:
    """Enough K-splits to reach ``target`` programs, at most one per block_k step."""
    wanted = triton.cdiv(target, max(programs_without_split, 1))
    return max(1, min(wanted, triton.cdiv(K, block_k)))


def gemv_configs(
    device: torch.device, T: int, top_k: int, H: int, I: int
) -> tuple[GemvConfig, GemvConfig]:
    """(gate_up, down) configs of the gemv path."""
    if device.type != "cuda":
        # The interpreter's cost is per program and per op, not per element.
        return GemvConfig(64, 64, split_k=2), GemvConfig(64, 128, split_k=2)
    pairs = T * top_k
    gu_n, gu_k = 32, 256
    gu_split = _split_k(pairs * triton.cdiv(I, gu_n), H, gu_k, GATE_UP_TARGET_PROGRAMS)
    dn_n, dn_k = 64, 128
    dn_split = _split_k(pairs * triton.cdiv(H, dn_n), I, dn_k, DOWN_TARGET_PROGRAMS)
    return (
        GemvConfig(gu_n, gu_k, split_k=gu_split, num_warps=4, num_stages=2, math=1),
        GemvConfig(dn_n, dn_k, split_k=dn_split, num_warps=4, num_stages=2, math=1),
    )


def tile_configs(
    device: torch.device, T: int, top_k: int, E: int, H: int, I: int
) -> tuple[TileConfig, TileConfig]:
    """(gate_up, down) configs of the tensor-core path (equal block_m)."""
    if device.type != "cuda":
        return TileConfig(16, 64, 128, split_k=2), TileConfig(16, 64, 128, split_k=2)
    pairs = T * top_k
    tokens_per_expert = pairs / E
    block_m = 16 if tokens_per_expert <= 16 else (32 if tokens_per_expert <= 48 else 64)
    blocks = min(pairs, E) + pairs // block_m
    gu_split = _split_k(blocks * triton.cdiv(I, 64), H, 128, GATE_UP_TARGET_PROGRAMS)
    dn_split = _split_k(blocks * triton.cdiv(H, 64), I, 128, DOWN_TARGET_PROGRAMS)
    return (
        TileConfig(block_m, 64, 128, split_k=gu_split, num_warps=4, num_stages=3),
        TileConfig(block_m, 64, 128, split_k=dn_split, num_warps=4, num_stages=3),
    )
