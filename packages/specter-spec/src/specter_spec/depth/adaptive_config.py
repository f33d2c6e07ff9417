"""Settings of the online adaptive depth policy."""

from __future__ import annotations

from dataclasses import dataclass

from specter_spec.depth.policy import check_depth

__all__ = ["AdaptiveDepthConfig"]


@dataclass(frozen=True)
class AdaptiveDepthConfig:
    """Settings of :class:`AdaptiveDepth`.

    Attributes:
        max_depth: the largest K considered (K_max).
        initial_depth: K of the first iteration, before anything is measured.
        acceptance_decay: weight kept by past iterations at each new one in the
            acceptance estimate (an exponential moving average; closer to 1
            reacts slower but is less noisy).
        cost_decay: the same for the timing estimates (each verified row count's
            verify time decays on its own: a count probed rarely keeps its measurement).
        prior_acceptance: acceptance assumed before any proposal was verified.
        prior_trials: how many proposals that prior is worth.
        probe_interval: every ``probe_interval``-th iteration runs a depth other
            than the best one (1 when the best is 0), so the estimates stay
            fresh and speculation can come back after K = 0 was chosen.
        max_probe_interval: a probe that leaves the best depth unchanged doubles the
            interval to the next one, up to this; one that changes it resets the
            interval to ``probe_interval``. Probing costs where it keeps confirming
            (a draft step dearer than a target step, with every expert resident).
        cost_horizon: a depth's draft and verify times are forgotten once no iteration
            ran it for this many iterations (the conditions they were measured in have
            moved on); more than twice ``max_probe_interval``, so the depths that K = 0
            probes in turn keep theirs.
        plain_probe_steps: a probe of K = 0 runs this many plain steps in a row, so a
            controller that queues plain steps ahead (``pipeline_plain``) shows their
            steady state, which a lone plain step (the host's work not hidden) does not.
        skip_losing_probes: while K = 0 is best, skip a probe of a depth whose own
            measured costs say it loses to plain decoding even with every proposal
            accepted (see :meth:`AdaptiveDepth.cannot_pay`); False probes it anyway.
    """

    max_depth: int = 16
    initial_depth: int = 4
    acceptance_decay: float = 0.9
    cost_decay: float = 0.9
    prior_acceptance: float = 0.5
    prior_trials: float = 1.0
    probe_interval: int = 8
    max_probe_interval: int = 32
    cost_horizon: int = 96
    plain_probe_steps: int = 3
    skip_losing_probes: bool = True

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
        if isinstance(self.cost_horizon, bool) or not (
            isinstance(self.cost_horizon, int) and self.cost_horizon > 2 * self.max_probe_interval
        ):
            raise ValueError(
                f"AdaptiveDepthConfig.cost_horizon must be an int > 2 * max_probe_interval="
                f"{2 * self.max_probe_interval}, got {self.cost_horizon!r}."
            )
        if isinstance(self.plain_probe_steps, bool) or not (
            isinstance(self.plain_probe_steps, int) and self.plain_probe_steps >= 1
        ):
            raise ValueError(
                f"AdaptiveDepthConfig.plain_probe_steps must be an int >= 1, "
                f"got {self.plain_probe_steps!r}."
            )
        if not isinstance(self.skip_losing_probes, bool):
            raise ValueError(
                f"AdaptiveDepthConfig.skip_losing_probes must be a bool, "
                f"got {self.skip_losing_probes!r}."
            )
