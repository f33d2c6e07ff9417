"""Measured times per count (verified rows, or draft proposals) and their monotone fit."""

from __future__ import annotations

__all__ = ["CostTable", "decayed"]


def decayed(mean: float | None, value: float, decay: float) -> float:
    """An exponential moving average's next value: ``value`` itself when there is none yet."""
    return value if mean is None else decay * mean + (1 - decay) * value


class CostTable:
    """Measured time per count ``n`` (verified rows, or draft proposals), and ``T(n)``.

    Each ``n`` keeps an exponentially decaying mean of its observations, decaying per
    iteration since each was made (so one probe at a depth run rarely replaces most of
    what that depth measured before, and ``cost_horizon`` iterations without one forget
    it). ``T(n)`` is the monotone (pool-adjacent-violators) fit of those means, weighted
    by their decayed weights, since more rows or
    proposals never cost less, joined piecewise linearly between measured counts and
    extended past the ends with the slope of the nearest segment. No global line through
    the origin or otherwise: under a memory budget the verify cost is concave in ``n``
    (each row adds fewer experts the others did not already need), and a draft iteration
    has a fixed part (its graph launch, the prefetch boundary) beside its per-proposal
    one. A line through ``n = 1, 2`` (plain decoding and its K = 1 probe), or a
    per-proposal draft cost measured at K = 1, prices deep speculation far above what it
    costs. With one count measured, ``proportional`` tables scale it (``T(n) = T(m) n /
    m``, the draft's estimate until a second depth ran); others know nothing yet.
    """

    def __init__(self, decay: float, proportional: bool = False) -> None:
        self.decay = decay
        self.proportional = proportional
        self.weight: dict[int, float] = {}
        self.total: dict[int, float] = {}
        self.last_seen: dict[int, int] = {}  # n -> the iteration that last measured it
        self.now = 0  # the iteration of the last tick
        self._knots: list[tuple[int, float]] | None = None  # at ``now``

    def add(self, rows: int, seconds: float, iteration: int) -> None:
        """Record one measurement of count ``rows``, made at ``iteration``."""
        keep = self.decay ** (iteration - self.last_seen.get(rows, iteration))
        self.weight[rows] = keep * self.weight.get(rows, 0.0) + 1.0
        self.total[rows] = keep * self.total.get(rows, 0.0) + seconds
        self.last_seen[rows] = iteration
        self._knots = None

    def tick(self, iteration: int, horizon: int) -> None:
        """Move to ``iteration``; drop every count not measured in the last ``horizon``."""
        for n in [n for n, seen in self.last_seen.items() if seen <= iteration - horizon]:
            del self.weight[n], self.total[n], self.last_seen[n]
        self.now = iteration
        self._knots = None

    def _weight_now(self, n: int) -> float:
        return self.weight[n] * self.decay ** (self.now - self.last_seen[n])

    def means(self) -> dict[int, float]:
        """``{n: decaying mean time in seconds}`` of every measured count, by ``n``."""
        return {n: self.total[n] / self.weight[n] for n in sorted(self.weight)}

    def knots(self) -> list[tuple[int, float]] | None:
        """``[(n, T(n))]`` of the monotone fit at the measured counts; None below two."""
        if len(self.weight) < 2:
            return None
        if self._knots is not None:
            return self._knots
        # Pool adjacent violators: blocks of (rows, weight, weighted mean), merged while a
        # block's mean exceeds the next one's.
        blocks: list[list] = []
        for n, mean in self.means().items():
            blocks.append([[n], self._weight_now(n), mean])
            while len(blocks) > 1 and blocks[-2][2] > blocks[-1][2]:
                rows, w, m = blocks.pop()
                prev = blocks[-1]
                prev[2] = (prev[1] * prev[2] + w * m) / (prev[1] + w)
                prev[1] += w
                prev[0] += rows
        self._knots = [(n, m) for rows, _, m in blocks for n in rows]
        return self._knots

    def curve(self, largest: int) -> list[float] | None:
        """``[T(0), ..., T(largest)]`` in seconds, None until two counts were measured
        (one, if ``proportional``)."""
        knots = self.knots()
        if knots is None:
            if not (self.proportional and self.weight):
                return None
            ((m, mean),) = self.means().items()
            return [mean * n / m for n in range(largest + 1)]
        out, i = [], 1
        for n in range(largest + 1):
            while i < len(knots) - 1 and knots[i][0] < n:
                i += 1
            (n0, v0), (n1, v1) = knots[i - 1], knots[i]
            out.append(max(v0 + (v1 - v0) * (n - n0) / (n1 - n0), 0.0))
        return out

    def cost(self, rows: int) -> float | None:
        """``T(rows)`` (see :meth:`curve`)."""
        curve = self.curve(rows)
        return None if curve is None else curve[rows]

    def mean_per_count(self) -> float | None:
        """Time per unit of ``n`` over every measurement (decayed weights), None if none."""
        weights = {n: self._weight_now(n) for n in self.weight}
        units = sum(w * n for n, w in weights.items())
        if units <= 0:
            return None
        return sum(w * self.total[n] / self.weight[n] for n, w in weights.items()) / units
