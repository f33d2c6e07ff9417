"""Which experts the host's cores compute instead of the device: a cost model and its choice.

Under a memory budget every expert a layer needs is read from a slot (resident), loaded
into one over PCIe (transferred), read in place from pinned host memory (streamed), or
computed on the host from that same memory (*CPU-homed*). A CPU-computed expert does not
give the bits the device's kernel gives, so which experts the host computes cannot follow
what happens to be resident or in flight: speculative decoding would then compute a row
differently from target-only decoding of the same engine, and greedy output would differ.
The choice here is made once, at load, from calibration only:

* ``PlacementCosts``: what the machine measured (host-to-device bandwidth, host time of one
  expert for one row and for each further row, device time of a resident expert, the fixed
  cost of a layer that hands rows to the host);
* ``choose_cpu_homed``: per layer, the ``n`` least routed experts of a calibration routing
  (never the excluded ones, such as a pinned hot set) become CPU-homed, with ``n`` the one
  that minimises the layer's expected finish time, the device's link traffic and the host's
  compute running side by side. Every other expert keeps the device's paths.

The model per layer and step of ``R`` rows: expert ``e`` is routed in a fraction ``f_e`` of
the calibration positions, so a step needs it with probability ``p_e = 1 - (1 - f_e)^R``
and routes ``R f_e`` rows to it on average. The device-homed experts beyond the layer's
``S`` slots (by frequency) miss and cross the link; the host computes the homed ones:

    link(n) = sum over device-homed misses of p_e * bytes / bandwidth + p_e * gpu_expert_s
    host(n) = sync_s + sum over homed of p_e * cpu_expert_s + (R f_e - p_e) * cpu_row_s
    T(n)    = max(link(n), host(n))    (T(0) = link(0): no host work, no sync)

The smallest ``n`` with the least ``T(n)`` wins. The slot count ``S`` should be one every
system compared at a budget shares (specter-models uses the budget's draftless plan), so
that they home the same experts and their greedy outputs stay comparable.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["CpuPlacement", "PlacementCosts", "choose_cpu_homed"]


@dataclass(frozen=True)
class PlacementCosts:
    """The machine's costs, measured at load.

    Attributes:
        link_bytes_per_s: host-to-device bandwidth of the pinned store (bytes/s).
        cpu_expert_s: host time of one expert of ``expert_bytes`` for one row, on the
            executor's threads.
        cpu_row_s: host time of each further row of that expert.
        gpu_expert_s: device time of one resident expert for one row.
        sync_s: fixed time a layer pays when it hands rows to the host (the routing read
            back, the results copied up).
        expert_bytes: the bytes of the expert these times were measured on (other layers'
            experts are scaled by their bytes).
        threads: host threads the times were measured with.
    """

    link_bytes_per_s: float
    cpu_expert_s: float
    cpu_row_s: float
    gpu_expert_s: float
    sync_s: float
    expert_bytes: int
    threads: int

    def __post_init__(self) -> None:
        for name in ("link_bytes_per_s", "expert_bytes", "threads"):
            if not getattr(self, name) > 0:
                raise ValueError(f"PlacementCosts.{name} must be > 0, got {getattr(self, name)!r}")
        for name in ("cpu_expert_s", "cpu_row_s", "gpu_expert_s", "sync_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"PlacementCosts.{name} must be >= 0, got {getattr(self, name)!r}")

    def cpu_seconds(self, rows: float, expert_bytes: int | None = None) -> float:
        """Host time of one expert for ``rows`` rows (0 rows: nothing)."""
        if rows <= 0:
            return 0.0
        scale = 1.0 if expert_bytes is None else expert_bytes / self.expert_bytes
        return scale * (self.cpu_expert_s + (rows - 1) * self.cpu_row_s)

    def link_seconds(self, expert_bytes: int | None = None) -> float:
        """Time one expert takes over the link."""
        return (self.expert_bytes if expert_bytes is None else expert_bytes) / self.link_bytes_per_s

    def as_dict(self) -> dict[str, float | int]:
        return {
            "link_gb_per_s": self.link_bytes_per_s / 1e9,
            "cpu_expert_ms": 1e3 * self.cpu_expert_s,
            "cpu_row_ms": 1e3 * self.cpu_row_s,
            "gpu_expert_ms": 1e3 * self.gpu_expert_s,
            "sync_ms": 1e3 * self.sync_s,
            "link_expert_ms": 1e3 * self.link_seconds(),
            "expert_bytes": self.expert_bytes,
            "threads": self.threads,
        }


@dataclass(frozen=True)
class CpuPlacement:
    """The CPU-homed experts of every layer and what the model expected of them.

    Attributes:
        homed: ``homed[layer]``: the layer's CPU-homed experts, ascending.
        rows: rows per step the choice assumed.
        slots_per_layer: the slots per layer it assumed resident.
        link_ms: expected link time per step of each layer with that choice.
        host_ms: expected host time per step of each layer (0 where nothing is homed).
        link_ms_without: expected link time per step of each layer with nothing homed.
        costs: the costs it was made with.
    """

    homed: tuple[tuple[int, ...], ...]
    rows: int
    slots_per_layer: tuple[int, ...]
    link_ms: tuple[float, ...] = ()
    host_ms: tuple[float, ...] = ()
    link_ms_without: tuple[float, ...] = ()
    costs: PlacementCosts | None = field(default=None, compare=False)

    @property
    def any(self) -> bool:
        """Whether some layer has a CPU-homed expert."""
        return any(self.homed)

    def describe(self) -> str:
        counts = [len(h) for h in self.homed]
        if not any(counts):
            return "no expert CPU-homed"
        spread = f"{min(counts)}-{max(counts)}" if min(counts) != max(counts) else str(counts[0])
        expected = sum(max(a, b) for a, b in zip(self.link_ms, self.host_ms, strict=True))
        without = sum(self.link_ms_without)
        return (
            f"{spread} experts a layer CPU-homed ({sum(counts)} in all); expected "
            f"{expected:.2f} ms of link or host time a step against {without:.2f} without"
        )

    def as_dict(self) -> dict[str, object]:
        return {
            "homed": [list(h) for h in self.homed],
            "homed_per_layer": [len(h) for h in self.homed],
            "rows": self.rows,
            "slots_per_layer": list(self.slots_per_layer),
            "expected_link_ms": list(self.link_ms),
            "expected_host_ms": list(self.host_ms),
            "expected_link_ms_without": list(self.link_ms_without),
            "costs": None if self.costs is None else self.costs.as_dict(),
        }


def _check_frequencies(frequencies: Sequence[Sequence[float]]) -> list[list[float]]:
    rows = [[float(f) for f in layer] for layer in frequencies]
    if not rows or len({len(r) for r in rows}) != 1 or not rows[0]:
        raise ValueError(
            "frequencies must be one non-empty list per layer, all of one length E (the share "
            f"of calibration positions routed to each expert), got {len(rows)} layers"
        )
    if any(not 0.0 <= f <= 1.0 for r in rows for f in r):
        raise ValueError("frequencies must lie in [0, 1] (a share of positions)")
    return rows


def _per_layer(value: int | Sequence[int] | None, layers: int, name: str, default: int) -> list:
    if value is None:
        return [default] * layers
    if isinstance(value, int):
        return [value] * layers
    out = list(value)
    if len(out) != layers:
        raise ValueError(f"{name} needs one value per layer ({layers}), got {len(out)}")
    return out


def choose_cpu_homed(
    frequencies: Sequence[Sequence[float]],
    slots_per_layer: int | Sequence[int],
    costs: PlacementCosts,
    *,
    rows: int = 1,
    expert_bytes: int | Sequence[int] | None = None,
    exclude: Sequence[Sequence[int]] | None = None,
    at_least: int = 0,
) -> CpuPlacement:
    """The CPU-homed experts of every layer (see the module docstring for the model).

    Args:
        frequencies: ``[L][E]``: the share of calibration positions whose top-k holds each
            expert (``specter_models.routing_counts`` divided by the positions).
        slots_per_layer: device slots per layer the choice assumes (one int or one a layer).
        costs: the machine's measured costs.
        rows: rows a step verifies (1 for plain decoding, about K + 1 when speculating).
        expert_bytes: bytes of one expert per layer (default: ``costs.expert_bytes``).
        exclude: experts per layer that stay on the device (a pinned hot set).
        at_least: home at least this many experts a layer where that many may be homed
            (``--cpu-experts on``: the host computes something even where the model says
            it does not pay).

    Returns:
        A ``CpuPlacement``; ties between counts go to the smaller count, and ties between
        equally routed experts to the higher id (the choice is deterministic).

    Raises:
        ValueError: malformed frequencies, counts or exclusions.
    """
    freq = _check_frequencies(frequencies)
    L, E = len(freq), len(freq[0])
    if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
        raise ValueError(f"rows must be an int >= 1, got {rows!r}")
    if isinstance(at_least, bool) or not isinstance(at_least, int) or at_least < 0:
        raise ValueError(f"at_least must be an int >= 0, got {at_least!r}")
    slots = _per_layer(slots_per_layer, L, "slots_per_layer", 0)
    sizes = _per_layer(expert_bytes, L, "expert_bytes", costs.expert_bytes)
    excluded = [set() for _ in range(L)] if exclude is None else [set(x) for x in exclude]
    if len(excluded) != L or any(not 0 <= e < E for x in excluded for e in x):
        raise ValueError(f"exclude needs one list of expert ids in [0, {E}) per layer")
    homed, link_ms, host_ms, without_ms = [], [], [], []
    for layer in range(L):
        f = freq[layer]
        p = [1.0 - (1.0 - fe) ** rows for fe in f]
        # Most routed first; equal shares: the lower id first (so the higher id is homed).
        order = sorted(range(E), key=lambda e: (-f[e], e))
        candidates = [e for e in reversed(order) if e not in excluded[layer]]
        link_e = costs.link_seconds(sizes[layer])
        gpu_e = costs.gpu_expert_s * sizes[layer] / costs.expert_bytes

        def link_time(
            n: int, order=order, p=p, link_e=link_e, gpu_e=gpu_e, layer=layer, candidates=candidates
        ) -> float:
            home = set(candidates[:n])
            device = [e for e in order if e not in home]
            misses = device[slots[layer] :]
            return sum(p[e] * link_e for e in misses) + sum(p[e] * gpu_e for e in device)

        def host_time(n: int, p=p, f=f, layer=layer, candidates=candidates) -> float:
            if n == 0:
                return 0.0
            work = sum(
                p[e] * costs.cpu_seconds(1, sizes[layer])
                + max(0.0, rows * f[e] - p[e]) * costs.cpu_row_s * sizes[layer] / costs.expert_bytes
                for e in candidates[:n]
            )
            return costs.sync_s + work

        # At most E - 1 homed: the device keeps one expert (its kernels' shapes need slots).
        most = min(len(candidates), E - 1)
        least = min(at_least, most)
        best_n, best_t = least, None
        for n in range(least, most + 1):
            t = max(link_time(n), host_time(n))
            if best_t is None or t < best_t - 1e-15:
                best_n, best_t = n, t
        homed.append(tuple(sorted(candidates[:best_n])))
        link_ms.append(1e3 * link_time(best_n))
        host_ms.append(1e3 * host_time(best_n))
        without_ms.append(1e3 * link_time(0))
    return CpuPlacement(
        homed=tuple(homed),
        rows=rows,
        slots_per_layer=tuple(slots),
        link_ms=tuple(link_ms),
        host_ms=tuple(host_ms),
        link_ms_without=tuple(without_ms),
        costs=costs,
    )
