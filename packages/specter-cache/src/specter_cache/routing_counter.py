"""Per-layer expert activation counters kept on the device.

The draft's MoE layers report their router's top-k choices with ``observe``; the counts stay
on the device (an ``index_add_``, no host sync). At a chunk boundary ``snapshot`` ranks every
layer's experts and copies one compact ``[2, L, M]`` tensor to the host: the only
device-to-host transfer per boundary.

Published counts (``publish``): every ``observe`` also writes its layer's counts row, stamped
with the forward's generation, into pinned host memory as the forward runs, so the host can
read a layer's counts while the device still computes the layers after it
(``published``), with no host sync. ``begin_forward`` stamps the rows of the next forward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

_COUNT_BITS = 20
"""Low bits of a published entry that hold the count; the generation sits above them."""
_MAX_GENERATION = (1 << (31 - _COUNT_BITS)) - 1
"""Generations cycle through 1 .. this (a published int32 entry stays positive)."""

PublishKernel = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None
]
"""``kernel(counts_row, ids, stamp, host_row_address, host_row)`` (see ``publish``)."""


class RoutingCounter:
    """``[L, E]`` int32 activation counters on ``device``.

    Args:
        num_layers: MoE layers ``L``.
        num_experts: routed experts per layer ``E``.
        device: where the counters live (the device the router ids are on).

    Raises:
        ValueError: non-positive sizes.

    Example:
        >>> counter = RoutingCounter(num_layers=2, num_experts=8, device="cpu")
        >>> counter.observe(0, torch.tensor([[1, 3], [3, 5], [5, 3]]))  # [T, k] top-k ids
        >>> counter.snapshot(top_m=2)[0]
        [3, 5]
    """

    def __init__(self, num_layers: int, num_experts: int, device: torch.device | str = "cpu"):
        for name, value in (("num_layers", num_layers), ("num_experts", num_experts)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        self.num_layers = num_layers
        self.num_experts = num_experts
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        self.counts = torch.zeros(num_layers, num_experts, dtype=torch.int32, device=self.device)
        self._ones = torch.ones(64, dtype=torch.int32, device=self.device)
        self.observations = 0  # observe() calls since the last clear (host-side bookkeeping)
        self._host: torch.Tensor | None = None  # [L, E] published rows (pinned on CUDA)
        self._generation = 0

    # -------------------------------------------------------------------------- publishing
    @property
    def publishing(self) -> bool:
        """Whether ``observe`` publishes each layer's counts to the host (``publish``)."""
        return self._host is not None

    def publish(self, kernel: PublishKernel | None = None) -> None:
        """From now on, every ``observe`` also writes its layer's counts row, stamped with the
        current generation (``begin_forward``), into pinned host memory, where ``published``
        reads it while the device runs on.

        On CUDA the write is a device-to-host copy queued behind the count (a graph captured
        from here on carries it), or, with ``kernel``, one launch that counts and writes the
        row in place of the ``index_add_`` (specter-kernels' ``observe_and_publish``: the
        same counts and rows, no extra launch). Call it before capturing the forwards that
        observe: a graph captured earlier does not publish, and ``published`` then never
        finds its rows (a reader falls back to a snapshot). Calling it again only changes
        the kernel.

        Args:
            kernel: ``kernel(counts_row [E] int32, ids [n], stamp [] int32, host_row_address
                [] int64, host_row [E] int32)``; it must leave ``counts_row`` as the
                ``index_add_`` would and write ``counts_row + stamp`` to the host row.
        """
        if self._host is None:
            shape = (self.num_layers, self.num_experts)
            pinned = self.device.type == "cuda"
            self._host = torch.zeros(shape, dtype=torch.int32, pin_memory=pinned)
            self._stamp = torch.zeros((), dtype=torch.int32, device=self.device)
            row_bytes = self.num_experts * 4
            self._host_addresses = torch.tensor(
                [self._host.data_ptr() + i * row_bytes for i in range(self.num_layers)],
                dtype=torch.int64,
                device=self.device,
            )
        self._publish_kernel = kernel

    def begin_forward(self) -> int:
        """Stamp the rows the next forward publishes with a new generation and return it
        (queued on the current stream, ahead of that forward; no host sync).

        Raises:
            RuntimeError: not publishing.
        """
        if self._host is None:
            raise RuntimeError("begin_forward() needs publish() first")
        self._generation = self._generation % _MAX_GENERATION + 1
        self._stamp.fill_(self._generation << _COUNT_BITS)
        return self._generation

    def published(self, layer: int, generation: int) -> list[int] | None:
        """Layer ``layer``'s counts ``[E]`` as the forward stamped ``generation`` published
        them, or None while its row is not all there (never blocks; reads the host row).

        A row whose counts outgrow the stamp's count field (``2**20``) never reads as
        published: a reader must fall back (a snapshot) once the forward is known done.
        """
        if self._host is None:
            raise RuntimeError("published() needs publish() first")
        row = self._host[layer].tolist()
        mask = (1 << _COUNT_BITS) - 1
        if any(v >> _COUNT_BITS != generation for v in row):
            return None
        return [v & mask for v in row]

    @staticmethod
    def rank(counts: Sequence[int], top_m: int) -> list[int]:
        """The ``top_m`` most-counted experts of a counts row, most first (ties: lower id
        first), zero counts left out: a snapshot's plan for one layer from host counts."""
        order = sorted((e for e, c in enumerate(counts) if c > 0), key=lambda e: (-counts[e], e))
        return order[:top_m]

    def observe(self, layer: int, topk_ids: torch.Tensor) -> None:
        """Count the experts chosen by a router: ``counts[layer, e] += #(topk_ids == e)``.

        No host synchronisation: ids are not range-checked on the host (an id outside
        ``[0, E)`` is a device-side error).

        Args:
            layer: MoE layer index.
            topk_ids: integer tensor of expert ids, any shape (e.g. ``[T, k]``), on the
                counter's device.

        Raises:
            ValueError: bad layer, non-integer ids, or ids on another device.
        """
        if (
            not isinstance(layer, int)
            or isinstance(layer, bool)
            or not 0 <= layer < self.num_layers
        ):
            raise ValueError(f"layer must be an int in [0, {self.num_layers}), got {layer!r}")
        if not isinstance(topk_ids, torch.Tensor) or topk_ids.dtype.is_floating_point:
            raise ValueError(
                f"topk_ids must be an integer tensor of expert ids, got "
                f"{getattr(topk_ids, 'dtype', type(topk_ids))}"
            )
        if topk_ids.device != self.device:
            raise ValueError(
                f"topk_ids are on {topk_ids.device}, the counters on {self.device}; create the "
                "RoutingCounter on the router's device"
            )
        ids = topk_ids.reshape(-1)
        n = ids.numel()
        if n > self._ones.numel():
            self._ones = torch.ones(
                max(n, 2 * self._ones.numel()), dtype=torch.int32, device=self.device
            )
        if ids.dtype not in (torch.int64, torch.int32):
            ids = ids.long()
        if self._host is not None and self._publish_kernel is not None:
            self._publish_kernel(
                self.counts[layer], ids, self._stamp, self._host_addresses[layer], self._host[layer]
            )
        else:
            self.counts[layer].index_add_(0, ids, self._ones[:n])
            if self._host is not None:
                self._host[layer].copy_(self.counts[layer] + self._stamp, non_blocking=True)
        self.observations += 1

    def snapshot(self, top_m: int | Sequence[int]) -> dict[int, list[int]]:
        """Each layer's most-used experts, most used first, copied to the host once.

        Experts never observed are left out, so a layer's list can be shorter than ``top_m``
        (or empty). Ties are broken by the device's top-k. Waits for the device's queued
        work (the copy is what the host reads); ``snapshot_async`` does not.

        Args:
            top_m: experts to keep per layer, one int or one per layer.

        Returns:
            ``layer -> ranked expert ids``.

        Raises:
            ValueError: ``top_m`` not positive or a list of the wrong length.
        """
        return self.snapshot_async(top_m).result()

    def snapshot_async(self, top_m: int | Sequence[int]) -> PendingSnapshot:
        """Start a snapshot of the counts as they stand after the work queued so far.

        On CUDA the ranking and a ``[2, L, M]`` int32 copy into pinned host memory are
        queued on the current stream, with an event behind them; nothing waits. The
        counters may be observed or cleared right after: the snapshot keeps its own copy.
        ``PendingSnapshot.result()`` waits for that event only (not for work queued later,
        such as the next draft forward) and returns what ``snapshot`` would have.

        Raises:
            ValueError: as ``snapshot``.
        """
        if isinstance(top_m, int) and not isinstance(top_m, bool):
            per_layer = [top_m] * self.num_layers
        else:
            per_layer = list(top_m)
            if len(per_layer) != self.num_layers:
                raise ValueError(
                    f"top_m needs {self.num_layers} entries (one per layer), got {per_layer}"
                )
        if any(not isinstance(m, int) or isinstance(m, bool) or m < 1 for m in per_layer):
            raise ValueError(f"top_m must be positive ints, got {top_m!r}")
        m = min(max(per_layer), self.num_experts)
        values, indices = torch.topk(self.counts, m, dim=1)
        packed = torch.stack((values, indices.to(torch.int32)))  # [2, L, M]
        if self.device.type != "cuda":
            return PendingSnapshot(packed, None, per_layer)
        host = torch.empty(packed.shape, dtype=packed.dtype, pin_memory=True)
        host.copy_(packed, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(self.device))
        return PendingSnapshot(host, ready, per_layer)

    def clear(self) -> None:
        """Zero every counter (no host sync)."""
        self.counts.zero_()
        self.observations = 0


class PendingSnapshot:
    """A routing snapshot on its way to the host (``RoutingCounter.snapshot_async``).

    Args:
        packed: ``[2, L, M]`` int32: counts and expert ids, ranked per layer (pinned host
            memory being filled by a queued copy, or a CPU tensor already final).
        ready: the CUDA event behind the copy, or None when ``packed`` is final.
        per_layer: experts to keep per layer.
    """

    def __init__(
        self, packed: torch.Tensor, ready: torch.cuda.Event | None, per_layer: list[int]
    ) -> None:
        self._packed = packed
        self._ready = ready
        self._per_layer = per_layer

    def done(self) -> bool:
        """Whether ``result()`` would return without waiting."""
        return self._ready is None or self._ready.query()

    def result(self) -> dict[int, list[int]]:
        """``layer -> ranked expert ids`` (experts with a zero count left out); waits for
        the snapshot's own copy only."""
        if self._ready is not None:
            self._ready.synchronize()
        packed = self._packed.tolist()
        return {
            layer: [
                e
                for v, e in zip(packed[0][layer][:keep], packed[1][layer][:keep], strict=True)
                if v > 0
            ]
            for layer, keep in enumerate(self._per_layer)
        }
