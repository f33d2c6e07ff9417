"""specter-spec's ``AdaptiveDepth`` against synthetic decodes, offline on the CPU.

Each environment draws i.i.d. acceptances and charges draft and verify times per depth; the
policy runs 64-token generations (``IterationStats.first`` on each one's first iteration) and
each generation's time per token is divided by the best fixed depth's expected time per
token. Environments: ``24gb``, DeepSeek-V2-Lite at 24 GB on the H200 (the medians of the
fortieth session's iteration traces, ``iterations-2026-12-04-absorb40-24gb-auto-*.jsonl``:
drafting 1/2/4/8/11/15 proposals 3.8/6.2/15.4/27.8/37.0/44.2 ms, verifying 1/2/3/5/9/12/16
rows 10.8/11.0/11.3/16.1/28.0/29.0/33.2 ms, linear between), and ``budget``, the concave-
verify shape of specter-spec's tests (its best depth about 11 at acceptance 0.9). Variants
of the policy (the shipped one, ``shipped``, and two guards against the deep drafts a run of
accepted shallow proposals buys, measured here and not kept):

* ``lcb``: depths compared at the acceptance ``--sd`` posterior standard deviations below
  its estimate (the decayed counts as a Beta posterior);
* ``cap``: an iteration runs at most twice the depth the one before it ran (at least
  ``initial_depth``);
* ``carry``: a primed policy's acceptance prior is the exporting run's estimate (at the
  prior's own weight, ``prior_trials``) instead of ``prior_acceptance`` (forty-first
  session, not kept either: it helps where the runs' acceptances match and costs where they
  do not, which the ``--mismatch`` pairs show).

Prints, per environment and variant, the mean, median and 90th percentile over ``--runs``
generations of the ratio to the best fixed depth, fresh (a new policy each) and primed (a
new policy primed with the fresh one's ``export_costs``). ``--mismatch`` adds pairs whose
primed run decodes at another acceptance than the run that exported the costs.

    python3 scripts/adaptive_depth_sim.py --runs 300 --mismatch
"""

from __future__ import annotations

import argparse
import math
import random
import statistics

from specter_spec import AdaptiveDepth, AdaptiveDepthConfig, IterationStats, expected_committed

DRAFT_24GB = {1: 3.8, 2: 6.2, 4: 15.4, 8: 27.8, 11: 37.0, 15: 44.2}
VERIFY_24GB = {1: 10.8, 2: 11.0, 3: 11.3, 5: 16.1, 9: 28.0, 12: 29.0, 16: 33.2}


def _linear(table: dict[int, float], n: int) -> float:
    """``table`` (ms) at ``n``, linear between its counts and past its ends."""
    counts = sorted(table)
    if n in table:
        return table[n]
    lo = max([c for c in counts if c < n], default=counts[0])
    hi = min([c for c in counts if c > n], default=counts[-1])
    if lo == hi:  # past an end: the nearest segment's slope
        lo, hi = (counts[0], counts[1]) if n < counts[0] else (counts[-2], counts[-1])
    return table[lo] + (table[hi] - table[lo]) * (n - lo) / (hi - lo)


SETUPS = (("24gb", 0.85), ("24gb", 0.75), ("24gb", 0.93), ("budget", 0.9))
# (environment, acceptance of the run that exported the costs, acceptance of the primed run)
MISMATCHED = (
    ("24gb", 0.93, 0.6),
    ("24gb", 0.6, 0.93),
    ("budget", 0.9, 0.6),
    ("budget", 0.6, 0.9),
)


class Environment:
    """I.i.d. acceptance ``alpha``; draft and verify seconds by depth and rows."""

    def __init__(self, kind: str, alpha: float, seed: int) -> None:
        self.kind, self.alpha, self.rng = kind, alpha, random.Random(seed)

    def draft(self, depth: int) -> float:
        if depth == 0:
            return 0.0
        if self.kind == "24gb":
            return _linear(DRAFT_24GB, depth) * 1e-3
        return 4.64e-3 + 3.26e-3 * depth

    def verify(self, rows: int) -> float:
        if self.kind == "24gb":
            return _linear(VERIFY_24GB, rows) * 1e-3
        return 4.35e-3 + 38.8e-3 * (1 - 0.7**rows)

    def seconds_per_token(self, depth: int) -> float:
        return (self.draft(depth) + self.verify(depth + 1)) / expected_committed(self.alpha, depth)

    def iteration(self, depth: int, first: bool) -> IterationStats:
        accepted = 0
        while accepted < depth and self.rng.random() < self.alpha:
            accepted += 1
        draft, verify = self.draft(depth), self.verify(depth + 1)
        return IterationStats(
            depth=depth, accepted=accepted, bonus=accepted == depth, committed=accepted + 1,
            draft_time_s=draft, verify_time_s=verify, total_time_s=draft + verify, first=first,
        )  # fmt: skip


class LowerBoundDepth(AdaptiveDepth):
    """Depths compared at the acceptance ``sd`` posterior standard deviations lower."""

    sd = 1.0

    @property
    def acceptance(self) -> float:
        alpha = self._accepted / self._trials
        spread = math.sqrt(alpha * (1 - alpha) / (self._trials + 1))
        return min(max(alpha - self.sd * spread, 0.0), 1.0)


class CappedDepth(AdaptiveDepth):
    """At most twice the depth the previous iteration ran (at least ``initial_depth``)."""

    def reset(self) -> None:
        super().reset()
        self._ran: int | None = None

    def choose_depth(self) -> int:
        depth = super().choose_depth()
        ran = self.config.initial_depth if self._ran is None else self._ran
        return min(depth, max(2 * ran, self.config.initial_depth))

    def observe(self, iteration: IterationStats) -> None:
        self._ran = iteration.depth
        super().observe(iteration)


class CarriedAcceptance(AdaptiveDepth):
    """Primed with the exporting run's acceptance as its prior (weight ``prior_trials``)."""

    def export_costs(self) -> dict:
        return {**super().export_costs(), "acceptance": self.acceptance}

    def prime(self, costs) -> None:
        super().prime({k: v for k, v in costs.items() if k != "acceptance"})
        self._accepted = costs["acceptance"] * self.config.prior_trials


VARIANTS = {
    "shipped": AdaptiveDepth,
    "lcb": LowerBoundDepth,
    "cap": CappedDepth,
    "carry": CarriedAcceptance,
}


def _generation(policy: AdaptiveDepth, env: Environment, tokens: int) -> float:
    """Seconds per token of one generation of ``tokens``."""
    seconds, made = 0.0, 0
    while made < tokens:
        depth = min(policy.choose_depth(), tokens - made - 1)
        it = env.iteration(depth, first=made == 0)
        policy.observe(it)
        seconds += it.total_time_s
        made += it.committed
    return seconds / made


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=300)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--sd", type=float, default=1.0, help="lcb: standard deviations below")
    p.add_argument(
        "--mismatch", action="store_true", help="also prime across different acceptances"
    )
    args = p.parse_args()
    LowerBoundDepth.sd = args.sd
    config = AdaptiveDepthConfig(max_depth=16)
    pairs = [(kind, alpha, alpha) for kind, alpha in SETUPS]
    if args.mismatch:
        pairs += MISMATCHED
    for kind, exported, alpha in pairs:
        probe = Environment(kind, alpha, 0)
        best = min(range(17), key=probe.seconds_per_token)
        floor = probe.seconds_per_token(best)
        source = "" if exported == alpha else f" (costs exported at acceptance {exported})"
        print(
            f"{kind} acceptance {alpha}{source}: best fixed K = {best}, "
            f"{floor * 1e3:.2f} ms a token"
        )
        for name, cls in VARIANTS.items():
            fresh, primed = [], []
            for run in range(args.runs):
                policy = cls(config)
                first = _generation(policy, Environment(kind, exported, run + 1), args.tokens)
                if exported == alpha:
                    fresh.append(first / floor)
                again = cls(config)
                again.prime(policy.export_costs())
                env = Environment(kind, alpha, run + 1 if exported == alpha else run + 10_001)
                primed.append(_generation(again, env, args.tokens) / floor)
            cells = []
            for label, xs in (("fresh", fresh), ("primed", primed)):
                if not xs:
                    continue
                xs.sort()
                cells.append(
                    f"{label} mean {statistics.mean(xs):.3f} median {xs[len(xs) // 2]:.3f} "
                    f"p90 {xs[int(0.9 * len(xs))]:.3f}"
                )
            print(f"  {name:8s} " + " | ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
