"""One forward over the new rows of several sequences, each in its own KV slot.

``PackedForward`` packs the segments' token ids into one ``[1, N]`` input with per-row
position ids and runs transformers' model once: every row-wise part (embeddings, norms,
projections, routers, the routed experts, the LM head) sees all ``N`` rows, so each MoE
layer computes the union of the sequences' experts in one expert-wise pass, while
attention runs per segment (``segmented_attention``) over the segment's own slot.

Each slot runs in the KV cache's window mode (``StaticKVCache.window``): its new rows are
written at device-side positions ``start .. start + rows - 1`` and its attention reads the
first ``window`` rows of its slot under a ``[1, 1, rows, window]`` causal mask
(``step_graphs.window_mask``). The caller picks each segment's window: the one a forward
of that sequence alone would use (``BatchedModel``), so a segment's attention is that
forward's, bit for bit where the row-wise kernels are batch-invariant.

With ``graphs`` (``batch_graphs``) a forward the caller marks graphable and that has no host
decision in it (the draft's; the target's where its misses are streamed or every expert
is resident) is captured per shape and replayed: the same kernels on the same inputs, so
the same bits as the eager forward.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from specter_models.batch_graphs import PackedGraphs
from specter_models.experts_runtime import ExpertsMode, ExpertsRuntime
from specter_models.kv_cache import StaticKVCache, cache_keyword
from specter_models.segmented_attention import AttentionSegment, install_segmented_attention
from specter_models.step_graphs import MASK_KINDS, window_mask
from specter_models.working_set import WorkingSet

__all__ = ["PackedForward", "SlotSegment"]


@dataclass(frozen=True)
class SlotSegment:
    """One sequence's new rows in a packed forward.

    Attributes:
        cache: the sequence's KV slot, cropped to ``start`` by the caller.
        input_ids: ``[T]`` int64 token ids on the model's device, ``T >= 1``.
        start: the position of ``input_ids[0]``.
        window: key rows its attention reads, ``start + T <= window <= max_seq_len``.
    """

    cache: StaticKVCache
    input_ids: torch.Tensor
    start: int
    window: int

    @property
    def rows(self) -> int:
        return int(self.input_ids.shape[0])


class PackedForward:
    """Runs packed forwards of one model (see the module docstring).

    Args:
        model: transformers' model (experts swapped for ``SpecterExperts``).
        runtime: the model's experts runtime.
        max_seq_len: positions each KV slot holds.
        working_set: counts each packed forward's experts per layer (``working_set``), or
            None.
        graphs: capture graphable forwards as CUDA graphs (``batch_graphs``; a CUDA
            model).

    Raises:
        ValueError: an attention implementation window mode does not support, or graphs on
            a model that is not on CUDA.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        runtime: ExpertsRuntime,
        max_seq_len: int,
        working_set: WorkingSet | None = None,
        graphs: bool = False,
    ):
        attn = model.config._attn_implementation
        if attn not in MASK_KINDS:
            raise ValueError(
                f"batched decoding supports attention implementations {sorted(MASK_KINDS)}, "
                f"the model uses {attn!r}; load it with one of those"
            )
        self.model = model
        self.runtime = runtime
        self.attention = install_segmented_attention(model)
        self.working_set = working_set
        self._mask_kind = MASK_KINDS[attn]
        parameter = next(model.parameters())
        self._dtype, self._device = parameter.dtype, parameter.device
        self._key_positions = torch.arange(max_seq_len, device=self._device)
        self.graphs = PackedGraphs(self._device) if graphs else None

    def __call__(
        self, mode: ExpertsMode, segments: Sequence[SlotSegment], graph: bool = False
    ) -> torch.Tensor:
        """Run ``segments`` in ``mode``; returns logits ``[N, V]``, the segments' rows in
        order. Afterwards each slot holds ``start + rows`` positions.

        A target forward on the streamed miss path (at most ``STREAM_MAX_ROWS`` rows)
        records as single-sequence verifications do (``streamed_misses``). ``graph``: the
        caller's windows come in buckets, so the forward may be captured and replayed
        (where graphs are on and nothing in it decides on the host).

        Raises:
            ValueError: no segment, or a segment whose rows do not fit its window.
        """
        if not segments:
            raise ValueError("a packed forward needs at least one segment")
        keys = self._key_positions
        for segment in segments:
            end = segment.start + segment.rows
            if not end <= segment.window <= keys.shape[0]:
                raise ValueError(
                    f"a segment of {segment.rows} rows at position {segment.start} needs a "
                    f"window of {end} to {keys.shape[0]} keys, got {segment.window}"
                )
        ids = torch.cat([segment.input_ids for segment in segments])
        rows = ids.shape[0]
        positions = torch.cat([keys[s.start : s.start + s.rows] for s in segments])
        runtime = self.runtime
        record = None
        if mode is ExpertsMode.TARGET and runtime.streams(rows):
            record = runtime.stream_record
        graphs = self.graphs
        graphed = (
            graph and graphs is not None and graphs.active and self._decides_on_device(mode, rows)
        )

        def forward(input_ids: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
            return self._forward(segments, input_ids, where)

        try:
            with contextlib.ExitStack() as stack:
                stack.enter_context(torch.no_grad())
                stack.enter_context(runtime.running(mode))
                stack.enter_context(_counting(runtime, self.working_set))
                if record is not None:
                    stack.enter_context(record.forward(runtime.cache, rows))
                if graphed:
                    logits = graphs.run(self._shape(mode, segments), ids, positions, forward)
                else:
                    logits = forward(ids, positions)
        except BaseException:
            # A forward that failed half-way leaves some layers longer than others.
            for segment in segments:
                segment.cache.crop_to(segment.start)
            raise
        for segment in segments:  # a replay runs none of the host code that sets them
            segment.cache.set_length(segment.start + segment.rows)
        if self.working_set is not None:
            self.working_set.end_forward(mode)
        return logits

    def _forward(
        self, segments: Sequence[SlotSegment], ids: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """The model over ``ids [N]`` at ``positions [N]`` (device), each segment in window
        mode with its mask made from the positions on the device: what a graph records."""
        keys = self._key_positions
        with contextlib.ExitStack() as stack:
            plan, begin = [], 0
            for segment in segments:
                where = positions[begin : begin + segment.rows]
                mask = window_mask(where, keys[: segment.window], self._mask_kind, self._dtype)
                end = segment.start + segment.rows
                stack.enter_context(segment.cache.window(segment.window, where, end))
                plan.append(AttentionSegment(begin, begin + segment.rows, segment.cache, mask))
                begin += segment.rows
            stack.enter_context(self.attention.segments(plan))
            output = self.model(
                input_ids=ids.unsqueeze(0),
                position_ids=positions.unsqueeze(0),
                attention_mask=plan[0].mask,  # 4-d: transformers builds no mask
                **{cache_keyword(self.model): segments[0].cache},
                use_cache=True,
            )
        return output.logits[0]

    def _decides_on_device(self, mode: ExpertsMode, rows: int) -> bool:
        """Whether a forward of ``rows`` rows in ``mode`` has no host decision in it: the
        draft's (INT4 experts resident, hot ones pinned), or the target's where its misses
        are streamed or every expert holds a slot; never while a routing trace is taken."""
        runtime = self.runtime
        if runtime.routing_trace is not None:
            return False
        if mode is ExpertsMode.DRAFT:
            return True
        return runtime.streams(rows) or runtime.cache.every_layer_resident()

    def _shape(self, mode: ExpertsMode, segments: Sequence[SlotSegment]) -> tuple:
        """What a capture of this forward fixes (``batch_graphs``): the mode, the switches
        its kernels were recorded under, and each segment's slot, rows and window."""
        runtime = self.runtime
        record = runtime.stream_record
        streams = mode is ExpertsMode.TARGET and record is not None and record.active
        return (
            mode,
            runtime.batch_invariant,
            runtime.stream_staging if streams else 0,
            runtime.stream_waits and streams,
            tuple((id(s.cache), s.rows, s.window) for s in segments),
        )


@contextlib.contextmanager
def _counting(runtime: ExpertsRuntime, working_set: WorkingSet | None) -> Iterator[None]:
    """``runtime.working_set`` set to ``working_set`` inside the block."""
    previous, runtime.working_set = runtime.working_set, working_set
    try:
        yield
    finally:
        runtime.working_set = previous
