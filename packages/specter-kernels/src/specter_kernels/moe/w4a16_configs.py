"""Tile shapes of the W4A16 kernels, chosen per problem size.

Chosen from sweeps on one H200 (``scripts/bench_kernels.py --sweep``,
``scripts/sweep_int4_gemv.py``). Under the Triton interpreter (CPU tests) small
fixed shapes keep the tests fast while still exercising split-K, masking and
every ``tl.dot`` dim >= 16.
"""

from __future__ import annotations

import torch
import triton

from specter_kernels.moe.w4a16_triton import GemvConfig, TileConfig

GEMV_MATH = 3
"""The gemv path's inner-loop math on CUDA (``GemvConfig.math``): the packed f16x2 math of
``int4_triton.int4_word_dot8``. One T = 1 MoE layer in a CUDA graph on an H200 took 19.3 us
for DeepSeek-V2-Lite with it and these tiles against 24.3 us with fp16 dequantization and the
wider tiles, Phi-3.5-MoE 39 against 60 us (``scripts/sweep_int4_gemv.py``)."""


def gemv_configs(
    device: torch.device, T: int, top_k: int, H: int, I: int
) -> tuple[GemvConfig, GemvConfig]:
    """(gate_up, down) configs of the gemv path."""
    if device.type != "cuda":
        # The interpreter's cost is per program and per op, not per element.
        return GemvConfig(64, 64, split_k=2), GemvConfig(64, 128, split_k=2)
    # Swept at T = 1 on DeepSeek-V2-Lite and Phi-3.5-MoE shapes inside CUDA graphs
    # (scripts/sweep_int4_gemv.py): the launches are latency-bound, so narrow tiles (more
    # programs in flight) are faster than wider ones; the pipelining depth hardly matters.
    # DeepSeek-V2-Lite's layer: 24.3 us with (32, 256) / (64, 128) tiles and fp16 math,
    # 19.3 us with these and the packed math; Phi-3.5-MoE's 60 -> 39 us.
    return (
        GemvConfig(16, 512, split_k=1, num_warps=4, num_stages=3, math=GEMV_MATH),
        GemvConfig(32, 128, split_k=min(4, triton.cdiv(I, 128)), num_warps=4, math=GEMV_MATH),
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
    # Swept at block_m 16: gate_up unsplit, down split 2 (T <= 8) or 1-2 (T 16-32).
    down_split = 2 if block_m == 16 else 1
    return (
        TileConfig(block_m, 64, 128, split_k=1, num_warps=4, num_stages=3),
        TileConfig(block_m, 64, 128, split_k=down_split, num_warps=4, num_stages=3),
    )
