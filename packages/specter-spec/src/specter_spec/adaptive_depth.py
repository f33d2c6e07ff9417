"""Online adaptive speculation depth from measured acceptance and costs."""

from __future__ import annotations

import math
from dataclasses import dataclass

from specter_spec.depth_policy import check_depth
from specter_spec.statistics import IterationStats

__all__ = ["AdaptiveDepth", "AdaptiveDepthConfig", "expected_committed"]


def expected_committed(acceptance: float, depth: int) -> float:
    """Expected tokens committed by one iteration of depth K.

    Each proposal survives independently with probability ``alpha`` until the
    first rejection, and the iteration always adds one correction or bonus
    token: ``E = 1 + alpha + ... + alpha^K = (1 - alpha^(K+1)) / (1 - alpha)``.

    Args:
        acceptance: per-proposal acceptance probability ``alpha`` in [0, 1].
        depth: K >= 0.
    """
    if acceptance >= 1.0:
        return float(depth + 1)
    return (1.0 - acceptance ** (depth + 1)) / (1.0 - acceptance)


@dataclass(frozen=True)
class AdaptiveDepthConfig:
    """Settings of :class:`AdaptiveDepth`.

    Attributes:
        max_depth: the largest K considered (K_max).
        initial_depth: K of the first iteration, before anything is measured.
        acceptance_decay: weight kept by past iterations at each new one in the
            acceptance estimate (an exponential moving average; closer to 1
            reacts slower but is less noisy).
        cost_decay: the same for the timing estimates.
        prior_acceptance: acceptance assumed before any proposal was verified.
        prior_trials: how many proposals that prior is worth.
        probe_interval: every ``probe_interval``-th iteration runs a depth other
            than the best one (1 when the best is 0), so the estimates stay
            fresh and speculation can come back after K = 0 was chosen.
        max_probe_interval: a probe that leaves the best depth unchanged doubles the
            interval to the next one, up to this; one that changes it resets the
            interval to ``probe_interval``. Probing costs where it keeps confirming
            (a draft step dearer than a target step, with every expert resident). Keep
            ``cost_decay ** max_probe_interval`` above about 0.03, or the verify-cost fit
            forgets the probed row count between probes.
    """

    max_depth: int = 16
    initial_depth: int = 4
    acceptance_decay: float = 0.9
    cost_decay: float = 0.9
    prior_acceptance: float = 0.5
    prior_trials: float = 1.0
    probe_interval: int = 8
    max_probe_interval: int = 32

    def __post_init__(self) -> None:
        check_depth(self.max_depth, "AdaptiveDepthConfig.max_depth")
        check_depth(self.initial_depth, "AdaptiveDepthConfig.initial_depth")
        if self.initial_depth > self.max_depth:
            raise ValueError(
                f"AdaptiveDepthConfig.initial_depth={self.initial_depth} exceeds "
                f"max_depth={self.max_depth}; lower it or raise max_depth."
            )
        for name in ("acceptance_decay", "cost_decay"):
            value = getattr(self, name)
            if not 0 <= value < 1:
                raise ValueError(f"AdaptiveDepthConfig.{name} must be in [0, 1), got {value!r}.")
        if not 0 <= self.prior_acceptance <= 1:
            raise ValueError(
                f"AdaptiveDepthConfig.prior_acceptance must be in [0, 1], "
                f"got {self.prior_acceptance!r}."
            )
        if not self.prior_trials > 0:
            raise ValueError(
                f"AdaptiveDepthConfig.prior_trials must be > 0, got {self.prior_trials!r}."
            )
        if isinstance(self.probe_interval, bool) or not (
            isinstance(self.probe_interval, int) and self.probe_interval >= 2
        ):
            raise ValueError(
                f"AdaptiveDepthConfig.probe_interval must be an int >= 2, "
                f"got {self.probe_interval!r}."
            )
        if isinstance(self.max_probe_interval, bool) or not (
            isinstance(self.max_probe_interval, int)
            and self.max_probe_interval >= self.probe_interval
        ):
            raise ValueError(
                f"AdaptiveDepthConfig.max_probe_interval must be an int >= probe_interval="
                f"{self.probe_interval}, got {self.max_probe_interval!r}."
            )


class _DecayingLinearFit:
    """Least-squares ``y ≈ a + b x`` over exponentially decaying observations, ``b >= 0``."""

    def __init__(self, decay: float) -> None:
        self.decay = decay
        self.weight = self.sum_x = self.sum_xx = self.sum_y = self.sum_xy = 0.0

    def add(self, x: float, y: float) -> None:
        d = self.decay
        self.weight = d * self.weight + 1.0
        self.sum_x = d * self.sum_x + x
        self.sum_xx = d * self.sum_xx + x * x
        self.sum_y = d * self.sum_y + y
        self.sum_xy = d * self.sum_xy + x * y

    def coefficients(self) -> tuple[float, float] | None:
        """``(a, b)``, or None while the observed ``x`` are (nearly) all equal."""
        if self.weight == 0:
            return None
        mean_x = self.sum_x / self.weight
        mean_y = self.sum_y / self.weight
        var_x = self.sum_xx / self.weight - mean_x * mean_x
        if var_x < 1e-3:
            return None
        # Verifying more tokens never gets cheaper; a negative slope is noise.
        slope = max((self.sum_xy / self.weight - mean_x * mean_y) / var_x, 0.0)
        return mean_y - slope * mean_x, slope


class AdaptiveDepth:
    """Picks K in [0, K_max] maximising expected committed tokens per second.

    After every iteration it updates:

    - the per-proposal acceptance ``alpha``: the ratio of exponentially
      decaying sums of accepted proposals and of verified proposals (accepted
      ones plus the rejected one, if any), which is the maximum-likelihood
      estimate when each proposal survives independently with probability
      ``alpha``;
    - the draft cost per proposal (decaying draft time / decaying K);
    - the verify cost as a function of the rows verified, ``V(n) = a + b n``
      (decaying least squares over ``n = K + 1``);
    - the per-iteration overhead outside both phases (KV rollback, bookkeeping).

    It then chooses ``argmax_K E(K) / (overhead + K * draft_cost + V(K + 1))``
    with ``E(K) = (1 - alpha^(K+1)) / (1 - alpha)``. K = 0 wins when drafting
    costs more than it saves: that is plain target decoding. Every so often it
    probes a neighbouring depth (1 when the best is 0; otherwise half or double
    the best), so a K = 0 decision is revisited and the verify cost is measured
    at more than one ``n``: first after ``probe_interval`` iterations, then after
    twice as many each time a probe leaves the best depth as it was (up to
    ``max_probe_interval``), and after ``probe_interval`` again once one changes
    it. Until two distinct ``n`` have been measured it alternates between
    ``initial_depth`` and a neighbour.

    One instance keeps learning across ``generate`` calls; :meth:`reset`
    forgets everything.

    Args:
        config: settings; defaults to ``AdaptiveDepthConfig()``.
    """

    def __init__(self, config: AdaptiveDepthConfig | None = None) -> None:
        self.config = config or AdaptiveDepthConfig()
        self.reset()

    @property
    def max_depth(self) -> int:
        """K_max."""
        return self.config.max_depth

    def reset(self) -> None:
        """Forget every measurement."""
        cfg = self.config
        self._accepted = cfg.prior_acceptance * cfg.prior_trials
        self._trials = cfg.prior_trials
        self._draft_time = 0.0
        self._draft_proposals = 0.0
        self._overhead = None
        self._verify = _DecayingLinearFit(cfg.cost_decay)
        self._choices = 0
        self._last_depth = cfg.initial_depth
        self._probes = 0  # neighbours tried so far (their parity picks down or up)
        self._interval = cfg.probe_interval
        self._next_probe = cfg.probe_interval  # the choice that probes next
        self._probed_best: int | None = None  # the best depth when the last probe ran

    # -- estimates -------------------------------------------------------------------

    @property
    def acceptance(self) -> float:
        """Estimated per-proposal acceptance ``alpha``."""
        return self._accepted / self._trials

    @property
    def draft_cost_s(self) -> float | None:
        """Estimated draft time per proposal, None before any draft was measured."""
        return self._draft_time / self._draft_proposals if self._draft_proposals > 0 else None

    @property
    def verify_cost_fit(self) -> tuple[float, float] | None:
        """``(a, b)`` of ``V(n) = a + b n`` in seconds, None until two ``n`` were measured."""
        return self._verify.coefficients()

    @property
    def overhead_s(self) -> float:
        """Estimated per-iteration time outside drafting and verifying."""
        return self._overhead or 0.0

    def expected_rate(self, depth: int) -> float | None:
        """Estimated committed tokens per second at depth K; None while costs are unknown."""
        fit, draft_cost = self.verify_cost_fit, self.draft_cost_s
        if fit is None or draft_cost is None:
            return None
        intercept, slope = fit
        seconds = self.overhead_s + depth * draft_cost + intercept + slope * (depth + 1)
        if seconds <= 0:
            return math.inf
        return expected_committed(self.acceptance, depth) / seconds

    def best_depth(self) -> int | None:
        """The K maximising :meth:`expected_rate` (smallest on ties); None while unknown."""
        rates = [self.expected_rate(k) for k in range(self.max_depth + 1)]
        if rates[0] is None:
            return None
        return max(range(len(rates)), key=lambda k: (rates[k], -k))

    # -- policy ----------------------------------------------------------------------

    @property
    def probe_interval(self) -> int:
        """Iterations from the last probe to the next one (see the class docstring)."""
        return self._interval

    def choose_depth(self) -> int:
        """The depth of the next iteration (see the class docstring)."""
        cfg = self.config
        self._choices += 1
        best = self.best_depth()
        if self._probed_best is not None and best is not None:
            # The last probe has been observed: back off while probes confirm the best.
            confirmed = best == self._probed_best
            self._interval = (
                min(2 * self._interval, cfg.max_probe_interval) if confirmed else cfg.probe_interval
            )
            self._next_probe = self._choices - 1 + self._interval
            self._probed_best = None
        if best is None:
            depth = self._neighbour(self._last_depth) if self._choices > 1 else self._last_depth
        elif self._choices >= self._next_probe:
            depth = self._neighbour(best)
            self._probed_best = best
            self._next_probe = self._choices + self._interval
        else:
            depth = best
        self._last_depth = depth
        return depth

    def _neighbour(self, depth: int) -> int:
        """Another depth near ``depth``, alternating down and up, within [0, K_max]."""
        self._probes += 1
        if depth == 0:
            return min(1, self.max_depth)
        down, up = depth // 2, min(2 * depth, self.max_depth)
        if up == depth or self._probes % 2 == 1:
            return down
        return up

    def observe(self, iteration: IterationStats) -> None:
        """Update the estimates with a finished iteration."""
        cfg = self.config
        depth = iteration.depth
        if depth > 0:
            # Proposals tested: up to the first rejection, among those the target verified
            # (all of them unless it cut its tail rows: see IterationStats.verified).
            tested = iteration.verified_proposals
            verified = iteration.accepted + (0 if iteration.accepted == tested else 1)
            self._accepted = cfg.acceptance_decay * self._accepted + iteration.accepted
            self._trials = cfg.acceptance_decay * self._trials + verified
            self._draft_time = cfg.cost_decay * self._draft_time + iteration.draft_time_s
            self._draft_proposals = cfg.cost_decay * self._draft_proposals + depth
        self._verify.add(depth + 1, iteration.verify_time_s)
        overhead = max(
            iteration.total_time_s - iteration.draft_time_s - iteration.verify_time_s, 0.0
        )
        if self._overhead is None:
            self._overhead = overhead
        else:
            self._overhead = cfg.cost_decay * self._overhead + (1 - cfg.cost_decay) * overhead

    def __repr__(self) -> str:
        return (
            f"AdaptiveDepth(max_depth={self.max_depth}, acceptance={self.acceptance:.3f}, "
            f"last_depth={self._last_depth})"
        )
