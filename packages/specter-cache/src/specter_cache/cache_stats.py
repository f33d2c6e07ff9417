"""Counters of an expert cache, per layer and in total.

Terms, counted per acquire (one layer's verification needs):

* hit: a needed expert already resident or in flight (no load issued by the acquire).
* miss: a needed expert the acquire had to load on demand (or, on the streamed miss path, that
  the verification read in place from host memory: a *streamed read*, whose bytes count in
  ``bytes_moved`` and ``streamed_bytes``; see ``StreamedMisses.record_streamed``). A streamed
  read that also filled a spare slot is a *streamed fill*: no bytes beyond the read.
* prefetch load: an expert loaded by ``prefetch``; it is *used* when an acquire needs it
  before it is evicted or its prefetch window ends (``expire_prefetches``), else *wasted*.
* prefetch precision: used / (used + wasted): the share of prefetched experts the target used.
* prefetch recall: used / (used + misses): of the needed experts that were not already
  retained in the cache, the share that a prefetch had brought in.
* stall: time the consumer waited on a transfer (CUDA: measured with events on the compute
  stream around the wait; CPU: host wall time of demand copies).
* waves: groups of ready experts handed to the consumer; ``overflow_acquires`` counts acquires
  that needed more experts than the layer has slots (computed in several rounds of slots).
* streamed histogram: streamed verifications of a layer by how many experts they read from
  host memory (``{count: layer verifications}``, zero counts included): how large a staging
  buffer (specter-kernels' ``stage_streamed``) would have to be to take every one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields


@dataclass
class LayerStats:
    """Counters of one layer (or the total). See the module docstring for the terms."""

    acquires: int = 0
    hits: int = 0
    misses: int = 0
    demand_loads: int = 0
    prefetch_loads: int = 0
    prefetch_used: int = 0
    prefetch_wasted: int = 0
    prefetch_dropped: int = 0
    evictions: int = 0
    bytes_moved: int = 0
    demand_bytes: int = 0
    prefetch_bytes: int = 0
    stall_seconds: float = 0.0
    waves: int = 0
    overflow_acquires: int = 0
    streamed_reads: int = 0
    streamed_bytes: int = 0
    streamed_fills: int = 0
    streamed_histogram: dict[int, int] = field(default_factory=dict)

    def add(self, other: LayerStats) -> None:
        """Add ``other``'s counters into this one (histograms bin by bin)."""
        for f in fields(self):
            if f.name == "streamed_histogram":
                for count, times in other.streamed_histogram.items():
                    self.streamed_histogram[count] = self.streamed_histogram.get(count, 0) + times
                continue
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    @property
    def hit_rate(self) -> float | None:
        """hits / (hits + misses), or None before any acquire."""
        n = self.hits + self.misses
        return self.hits / n if n else None

    @property
    def prefetch_precision(self) -> float | None:
        """used / (used + wasted), or None when no prefetch has been decided."""
        n = self.prefetch_used + self.prefetch_wasted
        return self.prefetch_used / n if n else None

    @property
    def prefetch_recall(self) -> float | None:
        """used / (used + misses), or None when nothing was needed beyond retained experts."""
        n = self.prefetch_used + self.misses
        return self.prefetch_used / n if n else None

    def as_dict(self) -> dict[str, object]:
        """Counters plus the derived rates (the histogram with its counts in order)."""
        d: dict[str, object] = asdict(self)
        d["streamed_histogram"] = dict(sorted(self.streamed_histogram.items()))
        d["hit_rate"] = self.hit_rate
        d["prefetch_precision"] = self.prefetch_precision
        d["prefetch_recall"] = self.prefetch_recall
        return d


class CacheStats:
    """Per-layer ``LayerStats`` of one cache.

    Args:
        num_layers: number of layers.
    """

    def __init__(self, num_layers: int):
        self.layers = [LayerStats() for _ in range(num_layers)]

    def reset(self) -> None:
        """Zero every counter."""
        self.layers = [LayerStats() for _ in self.layers]

    def total(self) -> LayerStats:
        """Sum over layers."""
        t = LayerStats()
        for s in self.layers:
            t.add(s)
        return t

    def as_dict(self) -> dict[str, object]:
        """``{"total": {...}, "per_layer": [{...}, ...]}`` with counters and rates."""
        return {
            "total": self.total().as_dict(),
            "per_layer": [s.as_dict() for s in self.layers],
        }
