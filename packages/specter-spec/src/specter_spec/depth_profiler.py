"""Offline depth profiling: sweep candidate depths, pick the lowest mean TPOT."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from specter_spec.controller import SpecController
from specter_spec.depth.policy import check_depth
from specter_spec.sampling import SamplingConfig
from specter_spec.spec_model import SpecModel

__all__ = ["DepthProfile", "profile_depth"]

ControllerFactory = Callable[[int], SpecController]


@dataclass(frozen=True)
class DepthProfile:
    """The outcome of :func:`profile_depth`.

    Attributes:
        best_depth: the candidate with the lowest mean TPOT (the smallest
            depth on a tie).
        mean_tpot_s: mean TPOT over the measured runs, per depth.
        tpot_s: every measured run's TPOT, per depth, in run order.
        acceptance_rate: accepted / proposed over the measured runs, per depth
            (None for depth 0).
        mean_accepted_per_iteration: per depth, over the measured runs.
    """

    best_depth: int
    mean_tpot_s: dict[int, float]
    tpot_s: dict[int, list[float]]
    acceptance_rate: dict[int, float | None]
    mean_accepted_per_iteration: dict[int, float]

    def as_dict(self) -> dict[str, Any]:
        """Plain-Python view, for JSON (depths become string keys)."""
        return {
            "best_depth": self.best_depth,
            "mean_tpot_s": {str(k): v for k, v in self.mean_tpot_s.items()},
            "tpot_s": {str(k): list(v) for k, v in self.tpot_s.items()},
            "acceptance_rate": {str(k): v for k, v in self.acceptance_rate.items()},
            "mean_accepted_per_iteration": {
                str(k): v for k, v in self.mean_accepted_per_iteration.items()
            },
        }


def profile_depth(
    models: ControllerFactory | tuple[SpecModel, SpecModel],
    prompts: Sequence[Sequence[int] | torch.Tensor],
    candidate_depths: Iterable[int],
    *,
    max_new_tokens: int = 64,
    warmup: int = 1,
    repeats: int = 1,
    sampling: SamplingConfig | None = None,
    cache: object | None = None,
    reset: Callable[[], None] | None = None,
    stop_token_ids: Iterable[int] = (),
) -> DepthProfile:
    """Measure mean TPOT at each candidate depth and pick the fastest.

    Every run starts from the same state: ``generate`` begins with empty KV
    caches, and ``reset`` (for instance an expert cache's reset) is called
    before every run, warm-up runs included. Each depth first runs ``warmup``
    generations on ``prompts[0]`` that are not recorded (compilation, memory
    pools, caches); then, ``repeats`` times over all prompts, the depths are
    interleaved prompt by prompt so that slow drift of the machine affects
    them alike.

    Args:
        models: a ``(draft, target)`` pair, or a factory ``depth -> SpecController``
            (to customise the controller; called once per depth).
        prompts: token id sequences.
        candidate_depths: depths K >= 0 to try (0 = plain target decoding).
        max_new_tokens: tokens generated per run (>= 1).
        warmup: unrecorded runs per depth before measuring (>= 0).
        repeats: measured passes over the prompts (>= 1).
        sampling: decoding settings when ``models`` is a pair (default greedy).
        cache: speculation observer when ``models`` is a pair.
        reset: called before every run.
        stop_token_ids: passed to ``generate``.

    Returns:
        The best depth and the per-depth measurements.

    Raises:
        ValueError, TypeError: on empty prompts or depths, or bad counts.
    """
    depths = sorted(set(candidate_depths))
    if not depths:
        raise ValueError("candidate_depths is empty; give at least one depth, e.g. [1, 2, 4, 8].")
    for depth in depths:
        check_depth(depth, f"candidate depth {depth!r}")
    if len(prompts) == 0:
        raise ValueError("prompts is empty; give at least one representative prompt.")
    for name, value, least in (
        ("max_new_tokens", max_new_tokens, 1),
        ("warmup", warmup, 0),
        ("repeats", repeats, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be an int >= {least}, got {value!r}.")

    if callable(models):
        factory = models
    elif isinstance(models, tuple) and len(models) == 2:
        draft, target = models
        factory = lambda depth: SpecController(
            draft, target, cache=cache, depth=depth, sampling=sampling
        )
    else:
        raise TypeError(
            "models must be a (draft, target) pair or a callable depth -> SpecController, "
            f"got {type(models).__name__}."
        )
    controllers = {depth: factory(depth) for depth in depths}
    stop = tuple(stop_token_ids)

    def run(depth: int, prompt: Sequence[int] | torch.Tensor):
        if reset is not None:
            reset()
        return controllers[depth].generate(prompt, max_new_tokens, stop).stats

    for depth in depths:
        for _ in range(warmup):
            run(depth, prompts[0])

    tpot: dict[int, list[float]] = {depth: [] for depth in depths}
    accepted = dict.fromkeys(depths, 0)
    proposed = dict.fromkeys(depths, 0)
    iterations = dict.fromkeys(depths, 0)
    for _ in range(repeats):
        for prompt in prompts:
            for depth in depths:
                stats = run(depth, prompt)
                tpot[depth].append(stats.tpot_s if stats.tpot_s is not None else math.inf)
                accepted[depth] += stats.accepted
                proposed[depth] += stats.proposed
                iterations[depth] += stats.num_iterations

    mean_tpot = {depth: sum(runs) / len(runs) for depth, runs in tpot.items()}
    best = min(depths, key=lambda depth: (mean_tpot[depth], depth))
    return DepthProfile(
        best_depth=best,
        mean_tpot_s=mean_tpot,
        tpot_s=tpot,
        acceptance_rate={d: accepted[d] / proposed[d] if proposed[d] else None for d in depths},
        mean_accepted_per_iteration={
            d: accepted[d] / iterations[d] if iterations[d] else 0.0 for d in depths
        },
    )
