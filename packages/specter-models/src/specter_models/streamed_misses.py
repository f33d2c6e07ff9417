"""The streamed miss path: a verification that needs no host decision under a budget.

Expert-wise verification with waves (``ExpertCache.acquire``) asks the host, at every MoE
layer, which experts the rows routed to: one sync per layer, then the cache's bookkeeping,
the loads and a launch per wave, while the GPU waits. On the streamed path
(``miss_path="stream"``) a layer is one launch of the grouped FP16 kernel over every routed
pair: an expert holding a slot is read from it, and one without a slot is read in place
from the host store's pinned memory over PCIe (specter-kernels' ``StreamedExperts``), with
the same bits either way. Nothing in the forward waits on the host, so the whole
verification is one CUDA graph, as it is with no budget.

The cache then changes only through prefetches, which the draft's routing plans while it
drafts. Two rules keep a streamed verification from reading a slot that is being
rewritten (``ExpertCache.streaming``): a load takes its victim off the device map before
overwriting it, on a side stream the verification waits for (``stream_guard``), and it
overwrites only after the last streamed verification (``mark_streamed_use``).

What a streamed verification did is recorded on the device as it runs (``StreamRecord``:
the routed ids of every layer, and which experts the kernel read from the host) and handed
to the cache after the forward in one read (``ExpertCache.record_streamed``), so hit rate,
bytes moved and the policy's recency stay as exact as on the acquire path.

Forwards of more than ``STREAM_MAX_ROWS`` rows (a prefill) and token-wise verification
keep the acquire path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from specter_cache import ExpertCache

MISS_PATHS = ("load", "stream")
"""``load``: missing experts are acquired (loaded into slots, computed in waves);
``stream``: they are read in place from pinned host memory (see the module docstring)."""


def check_miss_path(path: object) -> None:
    """Raise ``ValueError`` naming ``path`` unless it is one of ``MISS_PATHS``."""
    if path not in MISS_PATHS:
        raise ValueError(
            f"miss_path must be one of {MISS_PATHS} (acquire missing experts in waves, or read "
            f"them in place from pinned host memory), got {path!r}"
        )


STREAM_MAX_ROWS = 64
"""Forwards of at most this many rows take the streamed path (verifications; a prefill of
more rows acquires, since a kernel block of a streamed expert re-reads it per row block)."""


class StreamRecord:
    """What one streamed forward routed and streamed, on the device (filled by the graph).

    Args:
        num_layers: MoE layers ``L``.
        num_experts: ``E``.
        top_k: routed experts per row ``k``.
        device: the model's device.

    Attributes:
        ids: int64 ``[L, STREAM_MAX_ROWS, k]``: each layer writes its rows' routed experts.
        flags: uint8 ``[L, 2, E]``: the kernel sets 1 where it read an expert's gate_up
            (row 0) or down (row 1) weights from the host.
    """

    def __init__(self, num_layers: int, num_experts: int, top_k: int, device: torch.device):
        self.ids = torch.zeros(num_layers, STREAM_MAX_ROWS, top_k, dtype=torch.int64, device=device)
        self.flags = torch.zeros(num_layers, 2, num_experts, dtype=torch.uint8, device=device)
        self.rows = torch.zeros((), dtype=torch.int64, device=device)
        self._row_index = torch.arange(STREAM_MAX_ROWS, device=device)
        self.active = False

    @contextlib.contextmanager
    def forward(self, cache: ExpertCache, rows: int, *, count: bool = True) -> Iterator[None]:
        """Around a streamed forward of ``rows`` real rows (the padding rows repeat the last
        one): before it, clear the flags, set the row count the graph reads and wait for the
        map to be safe; after it (also after a failure), mark the slots used. With ``count``
        a forward that succeeded is read into the cache (one host sync)."""
        self.flags.zero_()
        self.rows.fill_(rows)  # a device-side write: no sync
        cache.stream_guard()
        self.active = True
        try:
            yield
        finally:
            self.active = False
            cache.mark_streamed_use()
        if count:
            self._count(cache, rows)

    def real_pairs(self, ids: torch.Tensor) -> torch.Tensor:
        """``ids [T, k]`` with the pairs of padding rows (past ``rows``) routed nowhere (-1).

        A graphed step pads its rows by repeating the last token; at other positions those
        rows route elsewhere, and streaming their experts would move bytes for nothing."""
        real = self._row_index[: ids.shape[0], None] < self.rows
        return torch.where(real, ids, -1)

    def _count(self, cache: ExpertCache, rows: int) -> None:
        ids = self.ids[:, :rows].reshape(self.ids.shape[0], -1).cpu()
        flags = self.flags.amax(dim=1).cpu()
        for layer, (routed, streamed) in enumerate(zip(ids.tolist(), flags.tolist(), strict=True)):
            cache.record_streamed(layer, routed, [e for e, f in enumerate(streamed) if f])
