"""Triton kernels of ``l2_prefetch``: a weight's bytes brought into the L2 cache ahead of use.

One program per stretch of ``LINES`` 128-byte lines. ``MODE = 0`` issues one
``prefetch.global.L2::evict_last`` per line (a hint: nothing comes back to the SM and
nothing waits for it); ``MODE = 1`` loads each line's first 4 bytes with the
``evict_last`` policy and writes each program's XOR of the words it read (``checksum[pid]``),
so the loads cannot be removed and a test can check what was read. ``evict_last`` asks the
L2 to evict these lines after lines loaded with the normal policy.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LINE_BYTES = 128
BLOCK_LINES = 256


@triton.jit
def _l2_prefetch_kernel(
    bytes_ptr,
    checksum_ptr,
    n_lines,
    LINES: tl.constexpr,
    BLOCK: tl.constexpr,
    MODE: tl.constexpr,
):
    pid = tl.program_id(0)
    first = pid.to(tl.int64) * LINES
    acc = tl.zeros([BLOCK], dtype=tl.int32)
    for start in range(0, LINES, BLOCK):
        line = first + start + tl.arange(0, BLOCK)
        inside = line < n_lines
        line = tl.minimum(line, n_lines - 1)
        if MODE == 0:
            tl.inline_asm_elementwise(
                "prefetch.global.L2::evict_last [$1];\n\tmov.u32 $0, 0;",
                "=r,l",
                [bytes_ptr + line * 128],
                dtype=tl.int32,
                is_pure=False,
                pack=1,
            )
        else:
            word = (bytes_ptr + line * 128).to(tl.pointer_type(tl.int32))
            value = tl.load(word, mask=inside, other=0, eviction_policy="evict_last")
            acc = acc ^ value
    if MODE == 1:
        tl.store(checksum_ptr + pid, tl.reduce(acc, 0, _xor))


@triton.jit
def _xor(a, b):
    return a ^ b


def launch_l2_prefetch(
    flat: torch.Tensor, programs: int, mode: int, checksum: torch.Tensor | None = None
) -> torch.Tensor | None:
    """Launch over ``flat`` (uint8, contiguous, at least one byte) with at most ``programs``
    programs; ``mode`` 0 (prefetch) or 1 (loads, each program's XOR into ``checksum``, made
    here when None). Returns the checksum buffer (mode 1) or None."""
    n_lines = triton.cdiv(flat.numel(), LINE_BYTES)
    lines = triton.cdiv(triton.cdiv(n_lines, programs), BLOCK_LINES) * BLOCK_LINES
    grid = triton.cdiv(n_lines, lines)
    if mode == 1 and checksum is None:
        checksum = torch.empty(grid, dtype=torch.int32, device=flat.device)
    _l2_prefetch_kernel[(grid,)](
        flat, checksum if mode == 1 else flat, n_lines, LINES=lines, BLOCK=BLOCK_LINES,
        MODE=mode, num_warps=4,
    )  # fmt: skip
    return checksum if mode == 1 else None
