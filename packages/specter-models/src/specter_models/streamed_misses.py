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
to the cache after the forward in one read (``StreamedMisses.record_streamed``), so hit rate,
bytes moved and the policy's recency stay as exact as on the acquire path.

A streamed expert's bytes cross PCIe and are gone, so routing that repeats would read it
again. *Fills* keep them (specter-kernels' ``streamed_fills``): before a verification the
cache offers every layer a few candidate slots, coldest first (``prepare_fills``: empty
slots, then the policy's next victims), the layer ranks its missing routed experts onto
the candidates whose experts it does not route to, evicting those on the device
(``assign_fill_slots``), and the kernel writes each such expert into its slot as it
streams it. After the forward the cache puts them on the device map (``commit_fills``) and
adopts them when it reads the record: they are resident, as if loaded, for no extra
transfer. ``StreamRecord.spares_per_layer`` sets how many candidates a layer gets, up to the
record's ``width``, fixed when it is made (``load(stream_fills=)``); a record of width 0 has
no fill launches at all. Fills are off by default: on DeepSeek-V2-Lite at 24 GB and
Qwen1.5-MoE at 14 GB (docs/decisions.md) they changed the bytes moved by 0-5% and the time
per token by less than the spread between two systems of one process, since the few slots a
tight budget leaves beside the hot set hold the draft's prefetches.

*Staging* (``load(stream_staging=)``, specter-kernels' ``stage_streamed``) changes how the
missing experts cross: before each layer's expert kernel, a wide copy kernel moves the
layer's first ``stream_staging`` missing routed experts (id order) from pinned memory into a
device buffer that every layer shares, and the expert kernel reads them there. The kernel's
own in-place reads give a missing expert only a few dozen programs, so few reads are in
flight; the copy gives it about a thousand. The bytes, the record and the bits are those of
plain streaming; the buffer is fixed state in the memory plan. Off by default: on the H200
it saved 5% with the 64-column per-pair tile, and nothing once that tile became 32 columns
wide (which spreads the in-place reads over twice the programs; docs/decisions.md).

*Waits* (``load(stream_waits=)``, on by default; specter-cache's
``StreamedMisses.wait_for_landing``) decide what a verification does with a prefetched expert
whose copy has not landed when its layer runs. Without them the map still says ``-1`` and
the kernel streams it, so its bytes cross the link twice (once by the copy engine, once read
in place, at about 30 GB/s against the copy engine's 50 on the H200). With them, each
layer's expert kernel first waits for the loads of that layer issued before the
verification launched (one event wait per layer, inside the graph) and reads them from their
slots; the other missing experts still stream. On DeepSeek-V2-Lite at 24 GB (H200, both
orders in one process each) 9.23 and 9.00 ms a token against 9.41 and 9.75 without
(docs/decisions.md).

Forwards of more than ``STREAM_MAX_ROWS`` rows (a prefill) and token-wise verification
keep the acquire path.
"""

from __future__ import annotations

import collections
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

DEFAULT_STREAM_FILLS = 0
"""Candidate slots per layer a streamed verification fills by default: none (see the module
docstring)."""


def _check_count(name: str, meaning: str, count: object) -> int:
    """``count`` unless it is not an int >= 0: then ``ValueError`` naming ``name``, what it
    means and the value."""
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise ValueError(f"{name} must be an int >= 0 ({meaning}), got {count!r}")
    return count


def check_stream_fills(count: object) -> int:
    """``count`` as spare slots per layer for streamed fills; ``ValueError`` unless an int >= 0."""
    return _check_count(
        "stream_fills",
        "candidate slots per layer that a streamed verification fills with the experts it "
        "streams; 0 turns fills off",
        count,
    )


DEFAULT_STREAM_STAGING = 0
"""Experts a streamed verification stages per layer by default: none (see the module
docstring)."""


def check_stream_staging(count: object) -> int:
    """``count`` as staging slots; ``ValueError`` unless an int >= 0."""
    return _check_count(
        "stream_staging",
        "device slots a streamed verification copies each layer's first missing experts "
        "into before its expert kernel; 0 turns staging off",
        count,
    )


DEFAULT_STREAM_WAITS = True
"""A streamed verification waits for each layer's loads in flight by default (see the module
docstring)."""


def check_stream_waits(enabled: object) -> bool:
    """``enabled`` unless it is not a bool: then ``ValueError`` naming the value."""
    if not isinstance(enabled, bool):
        raise ValueError(
            "stream_waits must be True (a streamed verification waits at each layer for that "
            "layer's loads in flight) or False (it streams them meanwhile), got "
            f"{enabled!r}"
        )
    return enabled


class StreamRecord:
    """What one streamed forward routed and streamed, on the device (filled by the graph).

    Args:
        num_layers: MoE layers ``L``.
        num_experts: ``E``.
        top_k: routed experts per row ``k``.
        device: the model's device.
        spares_per_layer: candidate slots per layer to fill (0: no fills).
        width: the most ``spares_per_layer`` can be raised to later (default: the given
            ``spares_per_layer``; 0: the record's forwards launch nothing for fills).
        deferred: count a forward's record when the cache next needs it
            (``ExpertCache.count_later``) instead of at the forward's end; None: on where
            ``device`` is a CUDA device. Deferred, the record goes to pinned host memory in
            one copy that nothing waits for, so the host can launch the next forward (the
            draft's) before it counts, and the device does not idle behind the count.

    ``pipelined`` (an attribute, default False; deferred records only): plain decoding's
    streamed steps, which load nothing between them, launch without counting the forward
    before (whose record needs that forward done): a step's fill candidates are chosen
    among the slots the forward still to count was not offered
    (``StreamedMisses.prepare_fills(exclude=, settle=False)``), whose holders the host knows,
    and experts that forward filled are claimed from the device map, so none is filled
    twice. The count is made after the launch instead, while the device runs the step. The
    candidates choose from a host view one step old; the tokens are the same.

    Attributes:
        ids: int64 ``[L, STREAM_MAX_ROWS, k]``: each layer writes its rows' routed experts.
        flags: uint8 ``[L, 2, E]``: the kernel sets 1 where it read an expert's gate_up
            (row 0) or down (row 1) weights from the host.
        spare_slots: int32 ``[L, F]``: each layer's candidate slots for this forward, the
            first to take first (-1 after the last), ``F = width``.
        spare_experts: int32 ``[L, F]``: the expert each candidate holds (-1: empty).
        claimed: int32 ``[L, E]``: the host's slot of each expert, loads in flight included
            (only experts with -1 may be filled).
        fills: int32 ``[L, E]``: the slot each layer filled each expert into (-1: none).
        deferred: whether records are counted later (see ``deferred`` above).
    """

    def __init__(
        self,
        num_layers: int,
        num_experts: int,
        top_k: int,
        device: torch.device,
        spares_per_layer: int = DEFAULT_STREAM_FILLS,
        width: int | None = None,
        deferred: bool | None = None,
    ):
        self.ids = torch.zeros(num_layers, STREAM_MAX_ROWS, top_k, dtype=torch.int64, device=device)
        self.flags = torch.zeros(num_layers, 2, num_experts, dtype=torch.uint8, device=device)
        self.rows = torch.zeros((), dtype=torch.int64, device=device)
        self._row_index = torch.arange(STREAM_MAX_ROWS, device=device)
        self.spares_per_layer = check_stream_fills(spares_per_layer)
        width = max(self.spares_per_layer, check_stream_fills(width or 0))
        self.spare_slots = torch.full((num_layers, width), -1, dtype=torch.int32, device=device)
        self.spare_experts = torch.full_like(self.spare_slots, -1)
        self.claimed = torch.full((num_layers, num_experts), -1, dtype=torch.int32, device=device)
        self.fills = torch.full((num_layers, num_experts), -1, dtype=torch.int32, device=device)
        self.active = False
        self.deferred = torch.device(device).type == "cuda" if deferred is None else bool(deferred)
        self.pipelined = False
        self._host_counts: torch.Tensor | None = None  # pinned, for deferred counts
        self._offers: collections.deque[list[dict[int, int]]] = collections.deque()

    def set_spares_per_layer(self, count: int) -> None:
        """Candidate slots per layer from the next forward on (0: no fills). More than the
        width the record was made with needs a new record (the graphs read its tensors)."""
        count = check_stream_fills(count)
        if count > self.width:
            raise ValueError(
                f"this stream record holds {self.width} candidate slots per layer, not "
                f"{count}: load with stream_fills={count} (or more), or set it before the first "
                "streamed forward"
            )
        self.spares_per_layer = count

    @property
    def width(self) -> int:
        """The most candidate slots per layer this record can hand out (0: no fills)."""
        return self.spare_slots.shape[1]

    @contextlib.contextmanager
    def forward(self, cache: ExpertCache, rows: int, *, count: bool = True) -> Iterator[None]:
        """Around a streamed forward of ``rows`` real rows (the padding rows repeat the last
        one): before it, clear the flags, set the row count the graph reads, hand out the
        candidate slots (with ``count`` and fills on) and wait for the map to be safe; after it
        (also after a failure), mark the slots used. With ``count`` a forward that succeeded
        puts its fills on the map and is read into the cache (one host sync)."""
        self.flags.zero_()
        self.rows.fill_(rows)  # a device-side write: no sync
        filling = count and self.spares_per_layer > 0
        pipelined = self.pipelined and self.deferred
        offer: list[dict[int, int]] | None = None
        if self.width:  # a record of width 0 has no fill launches, and its fills stay -1
            self.fills.fill_(-1)
            self.spare_slots.fill_(-1)  # no candidate, unless handed out below: no fills
        if filling:
            if pipelined:
                # The slots offered to forwards not yet counted may hold other experts now.
                busy = [set().union(*(o[layer] for o in self._offers)) for layer in
                        range(self.flags.shape[0])]  # fmt: skip
                slots, experts, claimed = cache.streamed.prepare_fills(
                    self.spares_per_layer, exclude=busy, settle=False
                )
                offer = cache.streamed.fill_candidates()
            else:
                slots, experts, claimed = cache.streamed.prepare_fills(self.spares_per_layer)
            self.spare_slots[:, : slots.shape[1]].copy_(slots, non_blocking=True)
            self.spare_experts[:, : experts.shape[1]].copy_(experts, non_blocking=True)
            self.claimed.copy_(claimed, non_blocking=True)
            if pipelined:
                # An expert a forward still to count filled is on the device map, not yet in
                # the host's claims: claim it from the map (in stream order, after that
                # forward's commit), so it is not filled twice.
                maps = cache.expert_to_slot_maps()
                self.claimed.copy_(torch.where(maps >= 0, maps, self.claimed))
        cache.streamed.stream_guard(settle=not pipelined)
        self.active = True
        succeeded = False
        try:
            yield
            succeeded = True
        finally:
            self.active = False
            # The forward is launched: the prefetch's held data copies go out beside it
            # (SpeculativePrefetcher(verify_lead=)); their waits were issued before it.
            cache.release_copies()
            if succeeded and filling:
                cache.streamed.commit_fills(self.fills)
            cache.streamed.mark_streamed_use()
        if count:
            self._count(cache, rows, offer)

    def real_pairs(self, ids: torch.Tensor) -> torch.Tensor:
        """``ids [T, k]`` with the pairs of padding rows (past ``rows``) routed nowhere (-1).

        A graphed step pads its rows by repeating the last token; at other positions those
        rows route elsewhere, and streaming their experts would move bytes for nothing."""
        real = self._row_index[: ids.shape[0], None] < self.rows
        return torch.where(real, ids, -1)

    def _count(
        self, cache: ExpertCache, rows: int, offer: list[dict[int, int]] | None = None
    ) -> None:
        """Hand the cache what the forward routed, streamed and filled: at once (one host
        sync), or, ``deferred``, through a copy to pinned memory that the cache counts when
        it next needs to (``ExpertCache.count_later``). ``offer``: a pipelined forward's
        candidates per layer (slot -> holder), counted against them."""
        L, E = self.flags.shape[0], self.flags.shape[2]
        ids = self.ids[:, :rows].reshape(L, -1)
        width = ids.shape[1]
        # One read: routed ids, streamed flags and fills of every layer side by side.
        both = torch.cat([ids, self.flags.amax(dim=1).long(), self.fills.long()], dim=1)
        if not self.deferred:
            _count_rows(cache, both.tolist(), width, E)
            return
        on_cuda = both.device.type == "cuda"
        # The last record's count is made: its host buffer may be reused. (Pipelined, this
        # forward is launched already, so the wait for the one before it idles no device.)
        cache.settle()
        if self._host_counts is None:  # room for the widest record, allocated once
            numel = L * (STREAM_MAX_ROWS * self.ids.shape[2] + 2 * E)
            self._host_counts = torch.empty(numel, dtype=torch.int64, pin_memory=on_cuda)
        host = self._host_counts[: both.numel()].view(both.shape)
        host.copy_(both, non_blocking=on_cuda)
        copied = torch.cuda.Event() if on_cuda else None
        if copied is not None:  # on the stream that ran the copy, whatever device is current
            copied.record(torch.cuda.current_stream(both.device))
        if offer is not None:
            self._offers.append(offer)

        def count() -> None:
            if copied is not None:
                copied.synchronize()  # the forward ended long ago when anything asks
            if offer is not None:
                if not self._offers or self._offers[0] is not offer:
                    raise RuntimeError("pipelined stream record counts ran out of order")
                self._offers.popleft()
            _count_rows(cache, host.tolist(), width, E, offer)

        cache.count_later(count)


def _count_rows(
    cache: ExpertCache,
    rows: list[list[int]],
    width: int,
    num_experts: int,
    offer: list[dict[int, int]] | None = None,
) -> None:
    """``record_streamed`` for each layer's row of ``[ids (width) | streamed flags (E) |
    fills (E)]`` (``offer``: each layer's candidates, for a pipelined forward)."""
    E = num_experts
    for layer, row in enumerate(rows):
        streamed = [e for e, f in enumerate(row[width : width + E]) if f]
        filled = {e: s for e, s in enumerate(row[width + E :]) if s >= 0}
        cache.streamed.record_streamed(
            layer,
            [e for e in row[:width] if e >= 0],  # -1: a pair the host computed (cpu_experts)
            streamed,
            filled=filled or None,
            candidates=offer[layer] if offer is not None else None,
        )
