"""Which linears the batch-invariant GEMV takes, and its tile: a function of (N, K, dtype).

:func:`gemv_config` answers None where the GEMV does not apply (K not a multiple of 8, so a
row is not 16-byte aligned; or K too long for one program's registers) and the tensor-core
kernel of :mod:`specter_kernels.invariant.matmul_triton` runs instead. The answer never looks
at the row count, so one shape always runs one kernel and the result stays batch-invariant.

Per GPU model, ``tuned/invariant_gemv_<gpu>.json`` beside this module (written by
``specter tune gemv --model M --write-config``, which times :func:`gemv_candidates`) keys
(N, K, dtype) to the GEMV tile measured best, or to ``"kernel": "mma"`` where the tensor-core
kernel was faster (a weighted sum of the 1- and 5-row times, :data:`ROW_WEIGHTS`). Shapes not
in the file get the heuristic below.
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

from specter_kernels.invariant.matmul_config import TUNED_DIR, device_slug, dtype_name

ROW_ALIGNMENT = 8
"""K must be a multiple of this: every row then starts 16 bytes apart (fp16) for the
kernel's vector loads."""
MAX_ROW_BYTES = 32 << 10
"""The longest weight row (``next_pow2(K) * itemsize``) one program holds; longer rows take
the tensor-core kernel."""
ROW_WEIGHTS = {1: 3.0, 5: 1.0}
"""How the sweep weighs a kernel's 1-row and 5-row times when it picks one: plain decoding
and the adaptive depth's short proposals (mostly 1-3 rows) outnumber 5-row verifications."""
TARGET_ELEMENTS_PER_THREAD = 32
"""The heuristic's weight elements per thread: enough loads in flight, registers to spare."""
HEURISTIC_ROWS = 1
"""The heuristic's rows per pass. Passes of 2-8 unrolled rows were slower on an H200 at every
DeepSeek-V2-Lite shape, at one row and at five (each row's reduction costs about as much
unrolled as looped, and a pass pays for all its rows)."""


@dataclass(frozen=True)
class InvariantGemvConfig:
    """Tile of one invariant GEMV launch.

    Attributes:
        block_n: output columns (weight rows) per program, a power of two.
        num_warps: warps per program (1, 2, 4, 8 or 16).
        rows: input rows per pass (unrolled; their loads are in flight together), 1 to 16.
    """

    block_n: int
    num_warps: int = 4
    rows: int = 1

    def __post_init__(self) -> None:
        if self.block_n < 1 or self.block_n & (self.block_n - 1):
            raise ValueError(f"block_n must be a power of two, got {self.block_n}")
        if self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"num_warps must be 1, 2, 4, 8 or 16, got {self.num_warps}")
        if not 1 <= self.rows <= 16:
            raise ValueError(f"rows must be 1 to 16, got {self.rows}")


def gemv_eligible(K: int, dtype: torch.dtype) -> bool:
    """Whether a ``[*, K]`` linear of ``dtype`` can take the GEMV at all (see the module)."""
    if dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return False
    width = triton.next_power_of_2(max(K, 1))
    return K > 0 and K % ROW_ALIGNMENT == 0 and width * dtype.itemsize <= MAX_ROW_BYTES


def heuristic_gemv_config(N: int, K: int, dtype: torch.dtype) -> InvariantGemvConfig:
    """About :data:`TARGET_ELEMENTS_PER_THREAD` weight elements a thread, 4 warps (8 for rows
    of 8192 elements or more), at most 8 columns a program, rows in passes of
    :data:`HEURISTIC_ROWS`."""
    width = triton.next_power_of_2(K)
    warps = 8 if width >= 8192 else 4
    block_n = max(1, min(8, TARGET_ELEMENTS_PER_THREAD * 32 * warps // width))
    return InvariantGemvConfig(min(block_n, triton.next_power_of_2(N)), warps, HEURISTIC_ROWS)


def gemv_candidates(
    N: int, K: int, dtype: torch.dtype, device_name: str | None = None
) -> list[InvariantGemvConfig]:
    """The tiles a tuning times for an eligible ``[*, K] x [K, N]`` linear: the heuristic's
    tile and the GPU model's tuned one first, then every (BLOCK_N, warps, rows a pass) of 1-8
    each that gives a thread 8 to 128 weight elements (64 in fp32) and no more columns a
    program than N needs.

    One- and two-warp tiles are in: with one warp a row's sum needs no cross-warp step (no
    shared memory, no barrier).
    """
    width = triton.next_power_of_2(K)
    found = [heuristic_gemv_config(N, K, dtype)]
    tuned = gemv_config(N, K, dtype, device_name) if device_name is not None else None
    if tuned is not None:
        found.append(tuned)
    for block_n, warps, rows in itertools.product((1, 2, 4, 8), repeat=3):
        per_thread = block_n * width / (32 * warps)
        fits = 8 <= per_thread <= 128 * 2 // dtype.itemsize
        if fits and block_n <= triton.next_power_of_2(N):
            found.append(InvariantGemvConfig(block_n, warps, rows))
    return list(dict.fromkeys(found))


def gemv_tuned_entry(
    N: int,
    K: int,
    dtype: torch.dtype,
    config: InvariantGemvConfig | None,
    times: dict[str, float],
) -> dict[str, Any]:
    """The tuned-file entry of a shape: the GEMV tile, or ``"kernel": "mma"`` (``config``
    None) where the tensor-core kernel was measured faster; the measured ``times``
    (microseconds, rounded to 0.01) beside it."""
    entry: dict[str, Any] = {"N": N, "K": K, "dtype": dtype_name(dtype)}
    if config is None:
        entry["kernel"] = "mma"
    else:
        entry.update(
            kernel="gemv", block_n=config.block_n, num_warps=config.num_warps, rows=config.rows
        )
    entry.update({name: round(us, 2) for name, us in times.items()})
    return entry


def tuned_gemv_path(device_name: str) -> Path:
    """The tuned GEMV file of a GPU model: ``tuned/invariant_gemv_<gpu>.json``."""
    return TUNED_DIR / f"invariant_gemv_{device_slug(device_name)}.json"


@functools.cache
def _tuned_table(path: Path) -> dict[tuple[int, int, str], InvariantGemvConfig | None]:
    """(N, K, dtype) -> the tuned tile, or None where the file says the tensor-core kernel
    was measured faster (``"kernel": "mma"``)."""
    if not path.is_file():
        return {}
    try:
        entries = json.loads(path.read_text())["configs"]
        table: dict[tuple[int, int, str], InvariantGemvConfig | None] = {}
        for e in entries:
            key = (int(e["N"]), int(e["K"]), str(e["dtype"]))
            kernel = e.get("kernel", "gemv")
            if kernel not in ("gemv", "mma"):
                raise ValueError(f"kernel {kernel!r} is neither 'gemv' nor 'mma'")
            table[key] = (
                InvariantGemvConfig(int(e["block_n"]), int(e["num_warps"]), int(e.get("rows", 1)))
                if kernel == "gemv"
                else None
            )
        return table
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(
            f"{path} is not a tuned invariant-GEMV file ({type(error).__name__}: {error}); "
            "expected {'configs': [{'N', 'K', 'dtype', 'kernel': 'gemv', 'block_n', 'num_warps'"
            "[, 'rows']} or {'N', 'K', 'dtype', 'kernel': 'mma'}, ...]}; fix it or "
            "write it again with specter tune gemv --model M --write-config on that GPU"
        ) from error


def gemv_config(
    N: int, K: int, dtype: torch.dtype, device_name: str | None = None
) -> InvariantGemvConfig | None:
    """The GEMV tile of an ``[*, K] x [K, N]`` linear of ``dtype``, or None where the
    tensor-core kernel runs instead (a shape the GEMV cannot take, or one the tuned file gives
    to the tensor-core kernel).

    With ``device_name`` the tuned file of that GPU model decides when it lists the shape
    (a tile, or None where it measured the tensor-core kernel faster); otherwise
    :func:`heuristic_gemv_config`. Equal arguments always give an equal answer.
    """
    if not gemv_eligible(K, dtype):
        return None
    if device_name is not None:
        table = _tuned_table(tuned_gemv_path(device_name))
        key = (N, K, dtype_name(dtype))
        if key in table:
            return table[key]
    return heuristic_gemv_config(N, K, dtype)
