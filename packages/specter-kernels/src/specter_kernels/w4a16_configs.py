"""Tile shapes of the W4A16 kernels, chosen per problem size.

Chosen from a sweep on one H200 (``scripts/bench_kernels.py --sweep``); see
docs/benchmarks-kernels.md. Under the Triton interpreter (CPU tests) small fixed
shapes keep the tests fast while still exercising split-K, masking and every
``tl.dot`` dim >= 16.
"""

from __future__ import annotations

import torch
import triton

from specter_kernels.w4a16_triton import GemvConfig, TileConfig

# Programs to aim for so every SM has several resident (132 SMs on an H200).
TARGET_PROGRAMS = 1024


def _split_k(programs_without_split: int, K: int, block_k: int) -> int:
    """Enough K-splits to reach TARGET_PROGRAMS, at most one per block_k step."""
    wanted = triton.cdiv(TARGET_PROGRAMS, max(programs_without_split, 1))
    return max(1, min(wanted, triton.cdiv(K, block_k)))


def gemv_configs(
    device: torch.device, T: int, top_k: int, H: int, I: int
) -> tuple[GemvConfig, GemvConfig]:
    """(gate_up, down) configs of the gemv path."""
    if device.type != "cuda":
        # The interpreter's cost is per program and per op, not per element.
        return GemvConfig(block_n=64, block_k=128), GemvConfig(block_n=64, block_k=128, split_k=2)
    pairs = T * top_k
    gate_up = GemvConfig(block_n=32, block_k=256, num_warps=4, num_stages=2)
    down_block_n, down_block_k = 64, 256
    split = _split_k(pairs * triton.cdiv(H, down_block_n), I, down_block_k)
    down = GemvConfig(
        block_n=down_block_n, block_k=down_block_k, split_k=split, num_warps=4, num_stages=2
    )
    return gate_up, down


def tile_configs(
    device: torch.device, T: int, top_k: int, E: int, H: int, I: int
) -> tuple[TileConfig, TileConfig]:
    """(gate_up, down) configs of the tensor-core path (equal block_m)."""
    if device.type != "cuda":
        return (
            TileConfig(block_m=16, block_n=64, block_k=128),
            TileConfig(block_m=16, block_n=64, block_k=128, split_k=2),
        )
    tokens_per_expert = T * top_k / E
    block_m = 16 if tokens_per_expert <= 16 else (32 if tokens_per_expert <= 48 else 64)
    gate_up = TileConfig(block_m=block_m, block_n=64, block_k=128, num_warps=4, num_stages=3)
    blocks = min(T * top_k, E) + T * top_k // block_m
    split = _split_k(blocks * triton.cdiv(H, 64), I, 128) if block_m == 16 else 1
    down = TileConfig(
        block_m=block_m, block_n=64, block_k=128, split_k=split, num_warps=4, num_stages=3
    )
    return gate_up, down
