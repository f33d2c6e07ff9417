"""Tile shapes of the batch-invariant matmul, a function of (N, K, dtype) only.

The config must never look at M or the batch size: a different tile along K, or
a different split of K across programs, changes the order in which a row's products
are summed, and so its rounding. A split fixed by (N, K, dtype) is fine: its partial
sums are added in a fixed order (see :mod:`specter_kernels.invariant.matmul_triton`).
BLOCK_M is fixed at 16 (the smallest tensor-core tile): at decode and verification sizes
(M <= 64) the matmul is bound by reading the weight, so a larger BLOCK_M would only waste
lanes.

Tiles measured best on a GPU model (``specter tune matmul --model M --write-config`` times
:func:`matmul_candidates`) are kept in ``tuned/invariant_matmul_<gpu>.json`` beside this
module, keyed by (N, K, dtype). Shapes not in the file get the heuristic below. Either way
the tile is a function of (N, K, dtype, GPU model) and never of M, so tuning keeps the kernel
batch-invariant.
"""

from __future__ import annotations

import functools
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import triton

from specter_kernels.tuned_files import device_slug

__all__ = [
    "BLOCK_M",
    "KEY_FIELDS",
    "TUNED_DIR",
    "MatmulConfig",
    "device_slug",
    "dtype_name",
    "matmul_candidates",
    "matmul_config",
    "matmul_tuned_entry",
    "tuned_config_path",
    "tuned_matmul_config",
]

KEY_FIELDS = ("N", "K", "dtype")
"""The fields naming a shape in a tuned file."""

TUNED_DIR = Path(__file__).parent / "tuned"

BLOCK_M = 16


@dataclass(frozen=True)
class MatmulConfig:
    """Tile shape of one invariant matmul launch.

    Attributes:
        block_m: output rows per program (fixed, see the module docstring).
        block_n: output columns per program, >= 16 (tensor-core minimum).
        block_k: reduction step, >= 16; fixes the summation order of each row.
        num_warps: warps per program.
        num_stages: software-pipelining depth (loads in flight).
        split_k: stretches K is cut into, each a program of its own, summed by a second
            kernel in a fixed order (1: one pass, no workspace).
    """

    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3
    split_k: int = 1

    def __post_init__(self) -> None:
        if self.split_k < 1:
            raise ValueError(f"split_k must be at least 1, got {self.split_k}")


def dtype_name(dtype: torch.dtype) -> str:
    """A dtype as tuned files spell it: ``torch.float16`` -> ``"float16"``."""
    return str(dtype).removeprefix("torch.")


def matmul_candidates(
    N: int, K: int, dtype: torch.dtype, device_name: str | None = None
) -> list[MatmulConfig]:
    """The tiles a tuning times for an ``[*, K] x [K, N]`` product: the heuristic's tile and
    the GPU model's tuned one first, then every (BLOCK_N, BLOCK_K, split) that gives enough
    programs to fill ~132 SMs and few enough to stay cheap (3 stages; 8 warps for tiles of
    64 x 256 elements or more).

    Narrow outputs (routers, one-column gates) give a handful of column tiles, so only deep
    splits of K fill the GPU there. A BLOCK_K over twice K (and over 128) is left out.
    """
    fp32 = dtype == torch.float32
    block_ns = (16, 32) if fp32 else (16, 32, 64)
    block_ks = (32, 64) if fp32 else (128, 256, 512)
    splits = (1, 2, 4, 8, 16) if N >= 256 else (1, 4, 16, 32, 64)
    found = [matmul_config(N, K, dtype), matmul_config(N, K, dtype, device_name)]
    for bn, bk, split in itertools.product(block_ns, block_ks, splits):
        warps = 8 if bn * bk >= 64 * 256 else 4
        programs = triton.cdiv(N, bn) * split
        if split > 1 and (programs > 2048 or K // split < bk):
            continue
        if split == 1 or programs >= min(128, 16 * split):
            found.append(MatmulConfig(BLOCK_M, bn, bk, warps, 3, split))
    return [c for c in dict.fromkeys(found) if c.block_k <= max(2 * K, 128)]


def matmul_tuned_entry(
    N: int, K: int, dtype: torch.dtype, config: MatmulConfig, times: dict[str, float]
) -> dict[str, Any]:
    """The tuned-file entry of a shape's tile, with the measured ``times`` (microseconds,
    rounded to 0.01) beside it."""
    tile = {
        "block_n": config.block_n,
        "block_k": config.block_k,
        "num_warps": config.num_warps,
        "num_stages": config.num_stages,
        "split_k": config.split_k,
    }
    rounded = {name: round(us, 2) for name, us in times.items()}
    return {"N": N, "K": K, "dtype": dtype_name(dtype), **tile, **rounded}


def _pow2_at_least(value: int, floor: int) -> int:
    return max(floor, 1 << max(0, value - 1).bit_length())


def tuned_config_path(device_name: str) -> Path:
    """The tuned-tile file of a GPU model: ``tuned/invariant_matmul_<gpu>.json``
    (``"NVIDIA H200"`` -> ``nvidia_h200``)."""
    return _config_path(device_name, TUNED_DIR)


@functools.cache
def _config_path(device_name: str, tuned_dir: Path) -> Path:
    # Cached: every matmul launch asks.
    return tuned_dir / f"invariant_matmul_{device_slug(device_name)}.json"


@functools.cache
def _tuned_table(path: Path) -> dict[tuple[int, int, str], MatmulConfig]:
    if not path.is_file():
        return {}
    try:
        entries = json.loads(path.read_text())["configs"]
        table = {}
        for e in entries:
            tile = (int(e["block_n"]), int(e["block_k"]), int(e["num_warps"]), int(e["num_stages"]))
            split = int(e.get("split_k", 1))
            key = (int(e["N"]), int(e["K"]), str(e["dtype"]))
            table[key] = MatmulConfig(BLOCK_M, *tile, split_k=split)
        return table
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(
            f"{path} is not a tuned invariant-matmul file ({type(error).__name__}: {error}); "
            "expected {'configs': [{'N', 'K', 'dtype', 'block_n', 'block_k', 'num_warps', "
            "'num_stages'[, 'split_k']}, ...]}; fix it or write it again with "
            "specter tune matmul --model M --write-config on that GPU"
        ) from error


def tuned_matmul_config(
    N: int, K: int, dtype: torch.dtype, device_name: str
) -> MatmulConfig | None:
    """The tuned tile of this shape on this GPU model, or None when none was measured."""
    key = (N, K, dtype_name(dtype))
    return _tuned_table(tuned_config_path(device_name)).get(key)


def matmul_config(
    N: int, K: int, dtype: torch.dtype, device_name: str | None = None
) -> MatmulConfig:
    """The tile shape for an ``[*, K] x [K, N]`` product of ``dtype`` inputs.

    With ``device_name`` (a CUDA device's name) a tuned tile of that GPU model is used
    when one exists for (N, K, dtype); otherwise the heuristic below.

    Narrow outputs get narrow tiles so that small N (2048-wide projections)
    still spreads over the GPU's ~132 SMs without splitting K; wide ones
    (vocab projections) use 64 or 128 columns per program.

    Args:
        N: output columns.
        K: reduction length.
        dtype: input dtype (fp16, bf16 or fp32).

    Returns:
        The config; equal arguments always give an equal config.
    """
    if device_name is not None:
        tuned = tuned_matmul_config(N, K, dtype, device_name)
        if tuned is not None:
            return tuned
    if N >= 32768:
        block_n = 128
    elif N >= 8192:
        block_n = 64
    elif N >= 4096:
        block_n = 32
    else:
        block_n = 16
    if dtype == torch.float32:
        # fp32 operands are twice as wide and multiply on CUDA cores: smaller K step.
        return MatmulConfig(BLOCK_M, block_n, min(64, _pow2_at_least(K, 16)), 4, 3)
    return MatmulConfig(BLOCK_M, block_n, min(128, _pow2_at_least(K, 16)), 4, 4)
