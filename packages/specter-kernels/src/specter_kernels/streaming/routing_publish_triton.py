"""Triton kernel of ``observe_and_publish``: one program counts the ids into the row and
stores the stamped row at the host address (a mapped pinned buffer on CUDA)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_IDS = 64


@triton.jit
def _observe_and_publish_kernel(
    ids_ptr,
    n,
    counts_ptr,
    stamp_ptr,
    address_ptr,
    E: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    experts = tl.arange(0, BLOCK_E)
    valid = experts < E
    added = tl.zeros([BLOCK_E], dtype=tl.int32)
    for start in range(0, n, BLOCK_N):
        offs = start + tl.arange(0, BLOCK_N)
        ids = tl.load(ids_ptr + offs, mask=offs < n, other=-1).to(tl.int32)
        added += tl.sum((ids[:, None] == experts[None, :]).to(tl.int32), axis=0)
    counts = tl.load(counts_ptr + experts, mask=valid, other=0) + added
    tl.store(counts_ptr + experts, counts, mask=valid)
    host = tl.load(address_ptr).to(tl.pointer_type(tl.int32))
    tl.store(host + experts, counts + tl.load(stamp_ptr), mask=valid)


def launch_observe_and_publish(
    counts_row: torch.Tensor, ids: torch.Tensor, stamp: torch.Tensor, host_address: torch.Tensor
) -> None:
    """Count ``ids [n]`` into ``counts_row [E]`` and store ``counts_row + stamp`` at the
    address ``host_address`` holds (one program)."""
    E = counts_row.numel()
    n = ids.numel()
    _observe_and_publish_kernel[(1,)](
        ids, n, counts_row, stamp, host_address, E=E,
        BLOCK_E=triton.next_power_of_2(E), BLOCK_N=min(BLOCK_IDS, triton.next_power_of_2(n)),
        num_warps=1,
    )  # fmt: skip
