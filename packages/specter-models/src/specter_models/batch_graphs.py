"""CUDA graphs of packed forwards: one captured forward per batch shape, replayed.

An eager packed forward (``batch_forward``) launches every kernel of the model from
Python: on DeepSeek-V2-Lite that is thousands of launches a step, and the host, not the
GPU, sets the step's time. ``PackedGraphs`` captures a packed forward the way
``step_graphs`` captures a single sequence's step: the first forward of a shape runs
eagerly (it gives that forward's result and compiles every kernel) and is then recorded;
later forwards of the shape copy their token ids and positions into the capture's static
buffers and replay it with one call.

A shape (the key) is everything a capture fixes: the experts mode, the batch-invariance
and streaming switches the kernels were recorded under, and per segment, in order, its
KV slot, its row count and its attention window. Positions are device values in the
static buffer, so a sequence moving forward inside one window replays the same graph. The
caller graphs only forwards without host decisions (the draft, and a target whose misses
are streamed or that holds every expert) whose windows come in buckets, so the shapes of a
decode repeat. The least recently used capture is dropped past ``max_graphs``: continuous
batching changes the set of slots, and each capture keeps its static buffers.

Every capture shares one memory pool and copies its logits into one output buffer kept
outside the pool (as wide as the most rows captured): what a capture allocates is free again
when it ends, for the next capture to reuse, so the pool holds about one forward's
activations whatever the number of shapes. A replay's logits are read before the next
forward runs, so sharing the buffer costs nothing.

A capture that fails switches the graphs off, with the reason in ``stats`` and a warning;
the forward's eager result is still returned.
"""

from __future__ import annotations

import collections
import warnings
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import torch

from specter_models.step_graphs import paused_collection

__all__ = ["MAX_PACKED_GRAPHS", "PackedGraphStats", "PackedGraphs"]

MAX_PACKED_GRAPHS = 64
"""Captured packed shapes kept at most (the least recently used one goes first)."""

PackedForwardFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``forward(input_ids [N], positions [N]) -> logits [N, V]`` of one packed shape."""


@dataclass
class PackedGraphStats:
    """What the packed graphs did.

    Attributes:
        captures: shapes captured (evicted ones included).
        replays: forwards served by a replay.
        eager: first forwards of a shape (run eagerly, then captured).
        evictions: captures dropped past ``max_graphs``.
        disabled_reason: why the graphs were switched off, or None.
    """

    replays: int = 0
    eager: int = 0
    evictions: int = 0
    captures: int = 0
    disabled_reason: str | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "captures": self.captures,
            "replays": self.replays,
            "eager": self.eager,
            "evictions": self.evictions,
            "disabled_reason": self.disabled_reason,
        }


@dataclass
class _PackedStep:
    """The static buffers and the capture of one shape."""

    input_ids: torch.Tensor  # [N] int64
    positions: torch.Tensor  # [N] int64
    graph: torch.cuda.CUDAGraph | None = None
    logits: torch.Tensor | None = None  # the graph's output [N, V]


class PackedGraphs:
    """Captured packed forwards of one model (see the module docstring).

    Args:
        device: the model's device (CUDA).
        max_graphs: captures kept at most, at least 1.

    Raises:
        ValueError: a device other than CUDA, or ``max_graphs`` below 1.
    """

    def __init__(self, device: torch.device | str, max_graphs: int = MAX_PACKED_GRAPHS):
        device = torch.device(device)
        if device.type != "cuda":
            raise ValueError(
                f"CUDA graphs need a CUDA model, this one is on {device}; batched decoding "
                "there runs eagerly"
            )
        if isinstance(max_graphs, bool) or not isinstance(max_graphs, int) or max_graphs < 1:
            raise ValueError(f"max_graphs must be an int >= 1, got {max_graphs!r}")
        self.device = device
        self.max_graphs = max_graphs
        self.stats = PackedGraphStats()
        self._steps: collections.OrderedDict[Hashable, _PackedStep] = collections.OrderedDict()
        self._pool = None
        self._out: torch.Tensor | None = None  # [rows, V]: every capture's logits

    @property
    def active(self) -> bool:
        """Whether graphs are still on (a failed capture switches them off)."""
        return self.stats.disabled_reason is None

    def __len__(self) -> int:
        return len(self._steps)

    def run(
        self,
        key: Hashable,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        forward: PackedForwardFn,
    ) -> torch.Tensor:
        """The logits ``[N, V]`` of ``forward(input_ids, positions)``: replayed where
        ``key``'s shape was captured, else run eagerly on the shape's new static buffers and
        captured (while graphs are active). The caller has set up everything ``forward``
        reads besides its two arguments, as for an eager call; the host-side effects of
        ``forward`` (KV lengths) are the caller's to redo after a replay.

        Returns:
            A tensor of the caller's own (not the graph's buffer).
        """
        step = self._steps.get(key)
        if step is not None and step.graph is not None:
            self._steps.move_to_end(key)
            step.input_ids.copy_(input_ids)
            step.positions.copy_(positions)
            step.graph.replay()
            self.stats.replays += 1
            return step.logits.clone()  # the next replay overwrites the graph's buffer
        step = _PackedStep(input_ids.clone(), positions.clone())
        logits = forward(step.input_ids, step.positions)
        self.stats.eager += 1
        if self.active:
            self._capture(key, step, forward, self._output(logits))
        return logits

    def _output(self, logits: torch.Tensor) -> torch.Tensor:
        """The shared output buffer's first rows for a capture of ``logits``' shape, the
        buffer grown (outside the pool) where it is too small; earlier captures keep the
        buffer they write."""
        rows, width = logits.shape
        out = self._out
        if out is None or out.shape[0] < rows or out.shape[1] != width or out.dtype != logits.dtype:
            same = out is not None and out.shape[1] == width and out.dtype == logits.dtype
            grown = max(rows, 2 * out.shape[0]) if same else rows
            self._out = out = torch.empty(grown, width, dtype=logits.dtype, device=logits.device)
        return out[:rows]

    def _capture(
        self, key: Hashable, step: _PackedStep, forward: PackedForwardFn, out: torch.Tensor
    ) -> None:
        """Record ``forward`` on ``step``'s buffers, its logits copied into ``out`` (nothing
        runs: this use's result came from the eager forward just before), and keep it,
        dropping the least recently used past ``max_graphs``."""
        if self._pool is None:
            self._pool = _new_pool()  # one pool: graphs never overlap

        def work() -> None:
            out.copy_(forward(step.input_ids, step.positions))

        try:
            graph = _record(self._pool, work)
        except Exception as error:  # a model op CUDA graphs cannot record
            reason = f"capture of a packed forward failed: {error}"
            self.stats.disabled_reason = reason
            self._steps.clear()
            warnings.warn(
                f"CUDA graphs of batched steps switched off: {reason}", RuntimeWarning, stacklevel=3
            )
            return
        step.graph, step.logits = graph, out
        self._steps[key] = step
        self.stats.captures += 1
        while len(self._steps) > self.max_graphs:
            self._steps.popitem(last=False)
            self.stats.evictions += 1


def _new_pool() -> object:
    """A memory pool for the captures (``torch.cuda.graph_pool_handle``)."""
    return torch.cuda.graph_pool_handle()


def _record(pool: object, work: Callable[[], None]) -> torch.cuda.CUDAGraph:
    """A CUDA graph of ``work``'s launches in ``pool`` (recorded, not run)."""
    graph = torch.cuda.CUDAGraph()
    # thread_local: CUDA calls of other threads (a server's) stay legal meanwhile.
    with (
        paused_collection(),
        torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"),
    ):
        work()
    return graph
