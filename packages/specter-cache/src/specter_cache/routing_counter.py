"""Per-layer expert activation counters kept on the device.

The draft's MoE layers report their router's top-k choices with ``observe``; the counts stay
on the device (an ``index_add_``, no host sync). At a chunk boundary ``snapshot`` ranks every
layer's experts and copies one compact ``[2, L, M]`` tensor to the host: the only
device-to-host transfer per boundary.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


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
        self.counts[layer].index_add_(0, ids, self._ones[:n])
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
