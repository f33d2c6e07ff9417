"""Candidate trials: the correctness gate, the timing and the choice of the best.

A tuning tries candidates (tiles) of one kernel at one shape. Each goes through the gate
first (its output checked against the torch reference; a tile that fails to compile fails
it too); only a candidate that passes is timed, so a wrong tile can never win. The timer is
a parameter: :func:`cuda_graph_timer` on a GPU, any ``Launch -> microseconds`` function in
tests.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import torch

__all__ = [
    "Launch",
    "Timer",
    "Trial",
    "best_trial",
    "cuda_graph_timer",
    "relative_error",
    "run_trials",
]

C = TypeVar("C")


@dataclass(frozen=True)
class Launch:
    """What a timer times: ``run(i)`` launches ``candidate`` on the ``i``-th of ``copies``
    distinct operand sets (distinct weights, so no launch finds its weight in L2).

    Attributes:
        candidate: the tile (or a baseline's name) being timed.
        label: which measurement of it, e.g. ``"m1"`` (one row).
        run: launches it on operand set ``i`` (``0 <= i < copies``).
        copies: how many operand sets there are.
    """

    candidate: Any
    label: str
    run: Callable[[int], object]
    copies: int


Timer = Callable[[Launch], float]
"""Microseconds one launch takes."""


@dataclass(frozen=True)
class Trial(Generic[C]):
    """One candidate's outcome.

    Attributes:
        candidate: the tile.
        failure: why the gate refused it (None: it passed and was timed).
        times_us: measurement label -> microseconds (empty when refused).
    """

    candidate: C
    failure: str | None = None
    times_us: Mapping[str, float] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """Whether the candidate passed the gate and was timed."""
        return self.failure is None


def relative_error(out: torch.Tensor, reference: torch.Tensor) -> float:
    """Relative Frobenius error in float64; inf where ``out`` holds a NaN or inf."""
    out, reference = out.double(), reference.double()
    if not torch.isfinite(out).all():
        return float("inf")
    return float((out - reference).norm() / reference.norm().clamp_min(1e-30))


def run_trials(
    candidates: Iterable[C],
    gate: Callable[[C], str | None],
    launches: Callable[[C], Sequence[Launch]],
    timer: Timer,
    progress: Callable[[Trial[C]], None] | None = None,
) -> list[Trial[C]]:
    """Gate, then time, each candidate.

    Args:
        candidates: the tiles, in order.
        gate: runs a candidate and returns why its output is wrong, or None when it is
            right. An exception (a tile that does not compile or fit) is a failure too.
        launches: the launches to time of a candidate that passed.
        timer: times one launch.
        progress: called with each trial as it ends.

    Returns:
        One trial per candidate.
    """
    trials: list[Trial[C]] = []
    for candidate in candidates:
        try:
            failure = gate(candidate)
            times = {} if failure else {run.label: timer(run) for run in launches(candidate)}
        except Exception as error:  # a tile that does not compile, fit or capture
            failure, times = f"{type(error).__name__}: {error}", {}
        trial = Trial(candidate, failure, times)
        trials.append(trial)
        if progress is not None:
            progress(trial)
    return trials


def best_trial(
    trials: Iterable[Trial[C]], score: Callable[[Mapping[str, float]], float]
) -> Trial[C] | None:
    """The passed trial of least ``score(times_us)`` (the first of equals); None when no
    trial passed."""
    passed = [t for t in trials if t.passed]
    return min(passed, key=lambda t: score(t.times_us)) if passed else None


def cuda_graph_timer(min_reps: int = 8, budget_s: float = 0.02) -> Timer:
    """A timer of device time inside a CUDA graph, as a decode step (a graph replay) pays it.

    The launch runs once per operand set eagerly on a side stream (compiling it and making
    any workspace outside the capture), then ``max(copies, min_reps)`` launches rotating over
    the sets are captured in one graph. Each replay is timed with CUDA events; the result is
    the median replay's time divided by the launches in it (5 to 40 replays, about
    ``budget_s`` seconds).
    """

    def time_us(launch: Launch) -> float:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for i in range(launch.copies):
                launch.run(i)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        reps = max(launch.copies, min_reps)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for r in range(reps):
                launch.run(r % launch.copies)
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        graph.replay()  # the first replay uploads the graph
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        first_s = start.elapsed_time(end) / 1e3
        replays = int(max(5, min(40, budget_s / max(first_s, 1e-6))))
        times = []
        for _ in range(replays):
            start.record()
            graph.replay()
            end.record()
            end.synchronize()  # a measurement: one sync per replay
            times.append(start.elapsed_time(end) * 1e3 / reps)
        del graph
        return statistics.median(times)

    return time_us
