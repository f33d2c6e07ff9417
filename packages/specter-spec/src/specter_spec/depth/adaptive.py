"""Online adaptive speculation depth from measured acceptance and costs."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from specter_spec.depth.adaptive_config import AdaptiveDepthConfig
from specter_spec.depth.cost_table import CostTable, decayed
from specter_spec.depth.saved_costs import read_saved_costs
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


class AdaptiveDepth:
    """Picks K in [0, K_max] maximising expected committed tokens per second.

    After every iteration it updates:

    - the per-proposal acceptance ``alpha``: the ratio of exponentially
      decaying sums of accepted proposals and of verified proposals (accepted
      ones plus the rejected one, if any), which is the maximum-likelihood
      estimate when each proposal survives independently with probability
      ``alpha``;
    - the draft time as a function of K (K >= 1): a decaying mean per measured K,
      fitted the same way (a draft iteration has a fixed part beside its per-proposal
      one), proportional to K while one depth has run;
    - the verify cost as a function of the rows verified ``n = K + 1``: a decaying
      mean per measured ``n``, fitted non-decreasing and joined piecewise linearly
      (not a line: under a budget each row adds fewer new experts than the last);
    - the per-iteration overhead outside both phases (KV rollback, bookkeeping).

    It then chooses ``argmax_K E(K) / (overhead + D(K) + V(K + 1))``
    with ``E(K) = (1 - alpha^(K+1)) / (1 - alpha)``. K = 0 wins when drafting
    costs more than it saves: that is plain target decoding. Every so often it
    probes a neighbouring depth (1 and ``initial_depth`` in turn when the best is 0;
    otherwise half or double the best), so a K = 0 decision is revisited at a depth
    deep enough to show what speculation buys, and the verify cost is measured at
    more than one ``n``: first after ``probe_interval`` iterations, then after
    twice as many each time a probe leaves the best depth as it was (up to
    ``max_probe_interval``), and after ``probe_interval`` again once one changes
    it. Until two distinct ``n`` have been measured it alternates between
    ``initial_depth`` and a neighbour. While K = 0 is best, a probe of a depth that
    :meth:`cannot_pay` by its own measured costs (it would lose to plain decoding even
    with every proposal accepted) is skipped, as if it had confirmed K = 0, until those
    costs expire (``cost_horizon``): with every expert resident a draft step costs nearly
    a target step, and such probes only slow plain decoding down.

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
        self._overhead: dict[bool, float | None] = {False: None, True: None}  # by K > 0
        self._steady: tuple[float, int] | None = None  # (pipelined plain step, observed at)
        self._plain_hold = 0  # plain steps a K = 0 probe still runs
        self._verify = CostTable(cfg.cost_decay)
        self._draft = CostTable(cfg.cost_decay, proportional=True)
        self._choices = 0
        self._observed = 0  # iterations observed
        self._last_depth = cfg.initial_depth
        self._probes = 0  # neighbours tried so far (their parity picks down or up)
        self._interval = cfg.probe_interval
        self._next_probe = cfg.probe_interval  # the choice that probes next
        self._probed_best: int | None = None  # the best depth when the last probe ran
        self._skipped_probes = 0  # probes of a depth that cannot pay, not run

    # -- estimates -------------------------------------------------------------------

    @property
    def acceptance(self) -> float:
        """Estimated per-proposal acceptance ``alpha``."""
        return self._accepted / self._trials

    @property
    def draft_cost_s(self) -> float | None:
        """Mean draft time per proposal over the depths measured (decaying), None before
        any draft was measured."""
        return self._draft.mean_per_count()

    def draft_time_s(self, depth: int) -> float | None:
        """Estimated draft time of an iteration of depth K (0 at K = 0), None before any
        draft was measured."""
        return 0.0 if depth == 0 and self._draft.weight else self._draft.cost(depth)

    @property
    def draft_times(self) -> dict[int, float]:
        """``{K: decaying mean draft time in seconds}`` of every depth K >= 1 measured."""
        return self._draft.means()

    def verify_cost_s(self, rows: int) -> float | None:
        """Estimated verify time of ``rows`` rows (K + 1), None until two were measured."""
        return self._verify.cost(rows)

    @property
    def verify_costs(self) -> dict[int, float]:
        """``{rows: decaying mean verify time in seconds}`` of every row count measured."""
        return self._verify.means()

    @property
    def overhead_s(self) -> float:
        """Estimated per-iteration time outside drafting and verifying, of speculative
        iterations (of plain ones until a speculative one was observed)."""
        return self._overhead_of(True)

    @property
    def plain_overhead_s(self) -> float:
        """The same for plain (K = 0) iterations, whose commit is lighter."""
        return self._overhead_of(False)

    def _overhead_of(self, speculative: bool) -> float:
        value = self._overhead[speculative]
        if value is None:
            value = self._overhead[not speculative]
        return value or 0.0

    @property
    def steady_plain_s(self) -> float | None:
        """Decaying mean time of a pipelined plain step (see ``IterationStats.pipelined``),
        None while none was observed within ``cost_horizon`` iterations."""
        if self._steady is None or self._observed - self._steady[1] > self.config.cost_horizon:
            return None
        return self._steady[0]

    def _rates(self, largest: int, acceptance: float | None = None) -> list[float] | None:
        """Estimated committed tokens per second at K = 0..largest (at ``acceptance``, the
        estimate by default); None while unknown."""
        verify = self._verify.curve(largest + 1)
        draft = self._draft.curve(largest) if self._draft.weight else None
        if verify is None or draft is None:
            return None
        alpha = self.acceptance if acceptance is None else acceptance
        overhead, steady = self.overhead_s, self.steady_plain_s
        # Plain decoding costs a pipelined step where the controller queues plain steps
        # ahead (the host's work hidden), else a one-row verification and its commit.
        plain = steady if steady is not None else self.plain_overhead_s + verify[1]
        rates = []
        for k in range(largest + 1):
            seconds = overhead + draft[k] + verify[k + 1] if k else plain
            rates.append(math.inf if seconds <= 0 else expected_committed(alpha, k) / seconds)
        return rates

    def expected_rate(self, depth: int) -> float | None:
        """Estimated committed tokens per second at depth K; None while costs are unknown."""
        rates = self._rates(depth)
        return None if rates is None else rates[depth]

    def best_depth(self) -> int | None:
        """The K maximising :meth:`expected_rate` (smallest on ties); None while unknown."""
        rates = self._rates(self.max_depth)
        if rates is None:
            return None
        return max(range(len(rates)), key=lambda k: (rates[k], -k))

    def cannot_pay(self, depth: int) -> bool:
        """Whether depth K >= 1 would decode slower than plain decoding even if every
        proposal were accepted, by the costs measured at K itself (its draft time and the
        verify time of K + 1 rows, both within ``cost_horizon``). False while either is
        unmeasured: a curve's extrapolation past its knots says nothing sure about K."""
        if depth < 1 or depth not in self._draft.weight or depth + 1 not in self._verify.weight:
            return False
        rates = self._rates(depth, acceptance=1.0)
        return rates is not None and rates[depth] < rates[0]

    # -- carried over between runs ---------------------------------------------------

    def export_costs(self) -> dict[str, Any]:
        """What this policy measured, to :meth:`prime` another one with (JSON-ready).

        ``{"draft": {K: s}, "verify": {rows: s}, "overhead": {"plain": s, "speculative": s},
        "steady_plain": s, "ages": {"draft": {K: i}, "verify": {rows: i}, "steady_plain":
        i}}``: the decaying mean draft time of each depth K, verify time of each row count,
        per-iteration overheads and pipelined plain step (None where not measured, or past
        ``cost_horizon``), and how many iterations ago each was last measured, so a primed
        policy expires them when this one would have, whatever runs they span.
        Acceptance is left out: it belongs to a prompt, the costs to a model, budget and
        machine.
        """
        steady = self.steady_plain_s
        return {
            "draft": {str(k): v for k, v in self.draft_times.items()},
            "verify": {str(n): v for n, v in self.verify_costs.items()},
            "overhead": {"plain": self._overhead[False], "speculative": self._overhead[True]},
            "steady_plain": steady,
            "ages": {
                "draft": {str(k): self._observed - s for k, s in self._draft.last_seen.items()},
                "verify": {str(n): self._observed - s for n, s in self._verify.last_seen.items()},
                "steady_plain": None if steady is None else self._observed - self._steady[1],
            },
        }

    def prime(self, costs: Mapping[str, Any]) -> None:
        """Start a fresh policy from costs an earlier one measured (:meth:`export_costs`).

        Each draft and verify time counts as one measurement made as many iterations ago
        as ``costs["ages"]`` says (now, where it says nothing), so the first choice is
        already the depth those costs favour (no exploration of depths the earlier run
        priced), later measurements of the same count outweigh it within a few iterations
        (``cost_decay``), and a count no iteration measures again expires ``cost_horizon``
        iterations after it was last measured, counting the earlier run's iterations too.
        The acceptance estimate keeps its prior.

        Raises:
            RuntimeError: this policy has observed an iteration since its last reset.
            ValueError: a depth below 1 or above ``max_depth``, a row count below 1 or
                above ``max_depth + 1``, a time that is not a finite number >= 0 or an age
                that is not an int >= 0; the policy is left as it was.
        """
        if self._observed or self._draft.weight or self._verify.weight:
            raise RuntimeError(
                "prime a fresh AdaptiveDepth (before its first iteration, or after reset()): "
                "this one has measured costs of its own"
            )
        saved = read_saved_costs(costs, self.max_depth)
        for table, times, age_of in (
            (self._draft, saved.draft, saved.draft_ages),
            (self._verify, saved.verify, saved.verify_ages),
        ):
            for count, seconds in times.items():
                table.add(count, seconds, -age_of.get(count, 0))
            table.tick(0, self.config.cost_horizon)
        for kind, seconds in ((False, saved.plain_overhead), (True, saved.speculative_overhead)):
            if seconds is not None:
                self._overhead[kind] = seconds
        if saved.steady_plain is not None:
            self._steady = (saved.steady_plain, -(saved.steady_plain_age or 0))

    # -- policy ----------------------------------------------------------------------

    @property
    def probe_interval(self) -> int:
        """Iterations from the last probe to the next one (see the class docstring)."""
        return self._interval

    @property
    def skipped_probes(self) -> int:
        """Probes not run since the last :meth:`reset` because their depth cannot pay
        (:meth:`cannot_pay`)."""
        return self._skipped_probes

    def choose_depth(self) -> int:
        """The depth of the next iteration (see the class docstring)."""
        cfg = self.config
        self._choices += 1
        if self._plain_hold > 0:  # a K = 0 probe runs its plain steps in a row
            self._plain_hold -= 1
            return 0
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
            if best == 0 and cfg.skip_losing_probes and self.cannot_pay(depth):
                # Even accepting every proposal, K would lose to plain decoding at the costs
                # measured at K (a draft step nearly as dear as a target step, every expert
                # resident): the probe could only confirm K = 0, so it counts as confirming
                # it without running. K's costs expire after cost_horizon iterations; the
                # probe after that runs and measures them again.
                self._interval = min(2 * self._interval, cfg.max_probe_interval)
                self._skipped_probes += 1
                depth = 0
            else:
                self._probed_best = best
            self._next_probe = self._choices + self._interval
        else:
            depth = best
        if depth == 0 and best != 0:
            self._plain_hold = cfg.plain_probe_steps - 1
        self._last_depth = depth
        return depth

    def _neighbour(self, depth: int) -> int:
        """Another depth near ``depth``, alternating down and up, within [0, K_max]; from
        0, 1 and ``initial_depth`` (at least 2) in turn."""
        self._probes += 1
        if depth == 0:
            deep = min(max(2, self.config.initial_depth), self.max_depth)
            return 1 if self._probes % 2 == 1 else deep
        if depth >= 2 and self._probes % 3 == 0:
            return 0  # every third probe: plain decoding, the rate any depth must beat
        down, up = depth // 2, min(2 * depth, self.max_depth)
        if up == depth or self._probes % 2 == 1:
            return down
        return up

    def observe(self, iteration: IterationStats) -> None:
        """Update the estimates with a finished iteration (a generation's ``first`` one
        counts for the acceptance only: its times are not a step's)."""
        cfg = self.config
        depth = iteration.depth
        self._observed += 1
        if depth > 0:
            # Proposals tested: up to the first rejection, among those the target verified
            # (all of them unless it cut its tail rows: see IterationStats.verified).
            tested = iteration.verified_proposals
            verified = iteration.accepted + (0 if iteration.accepted == tested else 1)
            self._accepted = cfg.acceptance_decay * self._accepted + iteration.accepted
            self._trials = cfg.acceptance_decay * self._trials + verified
        if not iteration.first:
            if depth > 0:
                self._draft.add(depth, iteration.draft_time_s, self._observed)
            self._verify.add(depth + 1, iteration.verify_time_s, self._observed)
        for table in (self._draft, self._verify):
            table.tick(self._observed, cfg.cost_horizon)
        if iteration.first:
            return
        if depth == 0 and iteration.pipelined:
            seconds = decayed(self.steady_plain_s, iteration.total_time_s, cfg.cost_decay)
            self._steady = (seconds, self._observed)
        overhead = max(
            iteration.total_time_s - iteration.draft_time_s - iteration.verify_time_s, 0.0
        )
        kind = depth > 0
        self._overhead[kind] = decayed(self._overhead[kind], overhead, cfg.cost_decay)

    def __repr__(self) -> str:
        return (
            f"AdaptiveDepth(max_depth={self.max_depth}, acceptance={self.acceptance:.3f}, "
            f"last_depth={self._last_depth})"
        )
