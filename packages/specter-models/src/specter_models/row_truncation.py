"""Miss-aware row truncation of greedy verification (opt-in: ``load(row_truncation=True)``).

Expert-wise verification of ``T = K + 1`` rows loads, at every MoE layer, each expert that
any row routes to. Under a memory budget the late rows are the expensive ones: row ``i``
yields a token only if the ``i`` proposals before it are all accepted (probability about
``alpha ** i``), yet its experts cost as much PCIe time as the first row's. Rows are causal:
row ``i``'s hidden state depends on rows ``<= i`` only. So at any layer the target may stop
computing the tail rows ``>= c`` (skip the experts only they need) and rows ``< c`` stay
exact; from then on only they are verified, and the acceptance rule reads rows ``< c`` (the
last one gives the correction or bonus token). Greedy output is unchanged: every committed
token is still the target's argmax after the committed prefix. Sampled decoding must not
use it: whether a row is kept depends on the proposals' routing, which would bias the
rejection sampler, so the controller allows truncation for greedy decoding only.

At each layer with missing experts the cut ``c`` maximises (1 <= c <= rows kept so far)::

    value(c) - cost(c) = token_s * sum_{i < c} alpha ** i
                         - expert_s * layers_left * |missing experts needed by rows < c|

``token_s`` is the time one more committed token saves (about a TPOT), ``expert_s`` the
transfer time of one expert, ``layers_left`` the MoE layers still to run including this one
(the layer's misses are taken as what keeping a row costs in each of them). Ties keep more
rows. ``alpha`` and ``token_s`` are moving averages the target adapter feeds after each
verification (``observe``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

__all__ = ["RowTruncation", "choose_cutoff"]


def choose_cutoff(
    rows: Sequence[Sequence[int]],
    missing: set[int],
    *,
    acceptance: float,
    token_seconds: float,
    expert_seconds: float,
    layers_left: int,
) -> int:
    """The number of leading rows worth verifying at this layer (at least 1).

    Args:
        rows: each kept row's routed expert ids at this layer (row 0 first).
        missing: the experts of this layer that are not resident (nor in flight).
        acceptance: per-proposal acceptance estimate ``alpha`` in ``[0, 1]``.
        token_seconds: what one more committed token is worth, in seconds.
        expert_seconds: host-to-device time of one expert, in seconds.
        layers_left: MoE layers still to run, this one included (>= 1).

    Returns:
        ``c`` in ``[1, len(rows)]``: verify rows ``0..c-1``.

    Raises:
        ValueError: no rows, or a parameter out of range.
    """
    if not rows:
        raise ValueError("choose_cutoff needs at least one row (row 0 is always verified)")
    if not 0.0 <= acceptance <= 1.0:
        raise ValueError(f"acceptance must lie in [0, 1], got {acceptance!r}")
    if token_seconds < 0 or expert_seconds < 0 or layers_left < 1:
        raise ValueError(
            f"token_seconds and expert_seconds must be >= 0 and layers_left >= 1, got "
            f"{token_seconds!r}, {expert_seconds!r}, {layers_left!r}"
        )
    per_miss = expert_seconds * layers_left
    best_c, best_gain = 1, None
    seen: set[int] = set()
    value = 0.0
    for i, row in enumerate(rows):
        value += token_seconds * acceptance**i
        seen.update(e for e in row if e in missing)
        gain = value - per_miss * len(seen)
        if best_gain is None or gain >= best_gain:  # ties keep more rows
            best_c, best_gain = i + 1, gain
    return best_c


@dataclass
class RowTruncation:
    """Miss-aware truncation of greedy verification rows; see the module docstring.

    Attributes:
        acceptance: per-proposal acceptance estimate (moving average over verifications).
        token_seconds: seconds one committed token is worth (moving average of the time
            between verifications per committed token).
        bandwidth_bytes_per_s: host-to-device bandwidth that prices a missing expert
            (None: the measured one, ``measured_bandwidth``, else ``DEFAULT_BANDWIDTH``).
        ema_weight: weight of a new observation in the moving averages, in ``(0, 1]``.
        measured_bandwidth: the transfers' measured bandwidth, set by the target adapter
            before each verification (the prefetch planner's estimate).

    Raises:
        ValueError: a value out of range.
    """

    acceptance: float = 0.7
    token_seconds: float = 0.03
    bandwidth_bytes_per_s: float | None = None
    ema_weight: float = 0.2
    measured_bandwidth: float | None = None

    DEFAULT_BANDWIDTH: ClassVar[float] = 25e9

    def __post_init__(self) -> None:
        if not 0.0 <= self.acceptance <= 1.0:
            raise ValueError(f"acceptance must lie in [0, 1], got {self.acceptance!r}")
        bandwidth = self.bandwidth_bytes_per_s
        if self.token_seconds < 0 or (bandwidth is not None and bandwidth <= 0):
            raise ValueError(
                "token_seconds must be >= 0 and bandwidth_bytes_per_s > 0, got "
                f"{self.token_seconds!r}, {self.bandwidth_bytes_per_s!r}"
            )
        if not 0.0 < self.ema_weight <= 1.0:
            raise ValueError(f"ema_weight must lie in (0, 1], got {self.ema_weight!r}")

    def cutoff(
        self, rows: Sequence[Sequence[int]], missing: set[int], expert_bytes: int, layers_left: int
    ) -> int:
        """``choose_cutoff`` with this object's estimates; ``expert_bytes`` prices a miss."""
        return choose_cutoff(
            rows,
            missing,
            acceptance=self.acceptance,
            token_seconds=self.token_seconds,
            expert_seconds=expert_bytes / self.bandwidth,
            layers_left=layers_left,
        )

    @property
    def bandwidth(self) -> float:
        """Bytes per second a miss is priced at: the fixed one, else the measured one."""
        return self.bandwidth_bytes_per_s or self.measured_bandwidth or self.DEFAULT_BANDWIDTH

    def observe(
        self, verified: int, accepted: int, seconds: float | None = None, committed: int = 0
    ) -> None:
        """Learn from one verification: ``accepted`` of ``verified`` proposals, and (when
        given) ``seconds`` of wall time per ``committed`` tokens since the last one."""
        w = self.ema_weight
        if verified > 0:
            self.acceptance = (1 - w) * self.acceptance + w * (accepted / verified)
        if seconds is not None and committed > 0:
            self.token_seconds = (1 - w) * self.token_seconds + w * (seconds / committed)
