"""The state every swapped experts module of one model shares: which model is running.

Draft and target are the same transformers model object; only their routed experts differ.
The adapters (``TargetModel``, ``DraftModel``) set the mode around each forward, and every
``SpecterExperts`` module reads it: INT4 experts for the draft, FP16 experts from the slot
cache for the target. Setting the mode is one attribute write.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from specter_cache import ExpertCache, RoutingCounter
from specter_kernels import StagingBuffer
from specter_models.row_truncation import RowTruncation
from specter_models.streamed_misses import (
    DEFAULT_STREAM_FILLS,
    DEFAULT_STREAM_STAGING,
    DEFAULT_STREAM_WAITS,
    STREAM_MAX_ROWS,
    StreamRecord,
    check_miss_path,
    check_stream_fills,
    check_stream_staging,
    check_stream_waits,
)

if TYPE_CHECKING:
    from specter_models.routing_replay import RoutingReplay

VERIFICATION_KINDS = ("expert", "token")


class ExpertsMode(enum.Enum):
    """Which routed experts a forward uses."""

    DRAFT = "draft"
    """INT4 experts resident on the device; router choices go to the routing counter."""
    TARGET = "target"
    """FP16 experts through the expert cache (expert-wise or token-wise verification)."""


class ExpertsRuntime:
    """Mode, expert cache and routing counter shared by a model's ``SpecterExperts``.

    Args:
        cache: the target's FP16 expert cache (may be attached after construction, before
            the first target forward).
        counter: the draft's routing counter (None: draft routing is not observed).
        verification: ``"expert"`` (each layer's experts in waves over all verified rows)
            or ``"token"`` (each row's experts loaded and computed in row order: the
            ``spec-lru`` reference and an ablation).
        batch_invariant: run target forwards so that every row's logits are bit-identical
            whatever the number of rows verified together (specter-kernels'
            ``BatchInvariantMode``, and routed pairs summed in a fixed order). Speculative
            greedy output then equals plain greedy output exactly, in fp16 too.
        invariant_draft_linears: run the draft's plain linears through the same
            batch-invariant GEMM kernel as the target's (tuned per shape on the GPU, it
            beats cuBLAS at one row) instead of torch's. The draft's results are never
            compared bit for bit, so this is a speed choice only.

    Raises:
        ValueError: an unknown verification kind.
    """

    def __init__(
        self,
        cache: ExpertCache | None,
        counter: RoutingCounter | None = None,
        verification: str = "expert",
        batch_invariant: bool = False,
        invariant_draft_linears: bool = False,
    ):
        self.cache = cache
        self.batch_invariant = batch_invariant
        self.invariant_draft_linears = invariant_draft_linears
        self.counter = counter
        self.mode: ExpertsMode | None = None
        self.verification = verification
        self.routing_trace: list[list[list[int]]] | None = None
        self.expert_split: Callable[..., Any] | None = None
        # A routing replay (routing_replay.py): recorded expert ids in place of the router's.
        self.routing_replay: RoutingReplay | None = None
        # Miss-aware row truncation (row_truncation.py): the policy (None: off), the rows
        # still verified in the running target forward (None: this forward may not be cut)
        # and where the host-to-device bandwidth estimate comes from.
        self.row_truncation: RowTruncation | None = None
        self.rows_kept: int | None = None
        self.bandwidth: Callable[[], float | None] | None = None
        # The streamed miss path (streamed_misses.py): its record while it is on.
        self._miss_path = "load"
        self.stream_record: StreamRecord | None = None
        self._stream_fills = DEFAULT_STREAM_FILLS
        self.fill_width = DEFAULT_STREAM_FILLS  # the stream record's width (load's stream_fills)
        # Staging (streamed_misses.py): the buffer load(stream_staging=) made, and how many of
        # its slots a verification uses now.
        self.staging: StagingBuffer | None = None
        self._stream_staging = DEFAULT_STREAM_STAGING
        self._staging_views: dict[int, StagingBuffer] = {}
        self._stream_waits = DEFAULT_STREAM_WAITS
        # The CPU expert executor (cpu_experts.py): None, or the one that computes every
        # layer's CPU-homed experts on the host. Installed between forwards.
        self.cpu_experts: Any = None
        # Batched decoding's working-set counts (working_set.py): None, or the WorkingSet
        # every forward's routed experts are marked in.
        self.working_set: Any = None

    @property
    def miss_path(self) -> str:
        """``"load"`` (missing experts acquired in waves) or ``"stream"`` (read in place from
        pinned host memory; ``streamed_misses``). Set it between forwards."""
        return self._miss_path

    def set_miss_path(self, path: str, top_k: int) -> None:
        """Switch the miss path (``top_k``: routed experts per row, for the stream record).

        Raises:
            ValueError: an unknown path.
        """
        check_miss_path(path)
        cache = self.cache
        if path == "stream" and cache.device.type == "cuda" and not cache.store.is_pinned:
            raise ValueError(
                "miss_path='stream' reads experts in place from the host store, which must be "
                f"pinned memory on CUDA; this one is not ({cache.store.pinning_note}): load "
                "with pin_memory=True, or keep miss_path='load'"
            )
        self._miss_path = path
        cache.streaming = path == "stream"
        if path == "stream" and self.stream_record is None:
            self.stream_record = StreamRecord(
                cache.num_layers, cache.num_experts, top_k, cache.device, self._stream_fills,
                width=self.fill_width,
            )  # fmt: skip

    @property
    def stream_fills(self) -> int:
        """Candidate slots per layer that a streamed verification fills with experts it
        streams (``streamed_misses``; 0: none). Set it between forwards, at most
        ``fill_width`` (the width of the stream record, which ``load(stream_fills=)`` sets).

        Raises:
            ValueError: not an int >= 0, or above ``fill_width``.
        """
        return self._stream_fills

    @stream_fills.setter
    def stream_fills(self, count: int) -> None:
        count = check_stream_fills(count)
        if count > self.fill_width:
            raise ValueError(
                f"stream_fills={count} is above this model's {self.fill_width} candidate slots "
                f"per layer: load with stream_fills={count} (or more) to fill that many"
            )
        if self.stream_record is not None:
            self.stream_record.set_spares_per_layer(count)
        self._stream_fills = count

    @property
    def stream_staging(self) -> int:
        """Experts per layer a streamed verification copies into the staging buffer before
        its expert kernel (``streamed_misses``; 0: none). Set it between forwards, at most
        the buffer's slots (``load(stream_staging=)``). Graphs are captured per value.

        Raises:
            ValueError: not an int >= 0, or above the buffer's slots.
        """
        return self._stream_staging

    @stream_staging.setter
    def stream_staging(self, count: int) -> None:
        count = check_stream_staging(count)
        width = 0 if self.staging is None else self.staging.num_slots
        if count > width:
            raise ValueError(
                f"stream_staging={count} is above this model's staging buffer of {width} "
                f"experts: load with stream_staging={count} (or more) to stage that many"
            )
        self._stream_staging = count

    @property
    def stream_waits(self) -> bool:
        """Whether a streamed verification waits at each layer for the layer's loads in
        flight (``StreamedMisses.wait_for_landing``) instead of streaming those experts
        (``streamed_misses``). Set it between forwards; graphs are captured per value.

        Raises:
            ValueError: not a bool.
        """
        return self._stream_waits

    @stream_waits.setter
    def stream_waits(self, enabled: bool) -> None:
        self._stream_waits = check_stream_waits(enabled)

    def staging_buffer(self) -> StagingBuffer | None:
        """The staging buffer narrowed to ``stream_staging`` slots (None when 0): views of
        the one buffer, made once per width."""
        count = self._stream_staging
        if count == 0 or self.staging is None:
            return None
        view = self._staging_views.get(count)
        if view is None:
            full = self.staging
            view = StagingBuffer(
                full.weights[:count], full.w13_addresses, full.w2_addresses,
                full.staged_experts[:count], full.hidden_dim, full.intermediate_dim,
            )  # fmt: skip
            self._staging_views[count] = view
        return view

    def streams(self, rows: int) -> bool:
        """Whether a target forward of ``rows`` rows takes the streamed miss path (never
        with every expert resident: nothing is missing, and there is nothing to record)."""
        return (
            self._miss_path == "stream"
            and self._verification == "expert"
            and 1 <= rows <= STREAM_MAX_ROWS
            and not self.cache.every_layer_resident()
        )

    @contextlib.contextmanager
    def splitting_experts(self, split: Callable[..., Any] | None) -> Iterator[None]:
        """Hand the target's routed-expert calls to ``split(module, hidden, ids, weights)``
        for the block (None: no change). Step graphs use it to run the experts of real rows
        only, and to cut a captured forward at each call (``step_graphs``)."""
        if split is None:
            yield
            return
        previous = self.expert_split
        self.expert_split = split
        try:
            yield
        finally:
            self.expert_split = previous

    @property
    def verification(self) -> str:
        """``"expert"`` or ``"token"``."""
        return self._verification

    @verification.setter
    def verification(self, kind: str) -> None:
        if kind not in VERIFICATION_KINDS:
            raise ValueError(
                f"verification must be one of {VERIFICATION_KINDS} (expert-wise waves or "
                f"token-wise order), got {kind!r}"
            )
        self._verification = kind

    @property
    def invariant_active(self) -> bool:
        """True while a target forward of a batch-invariant model runs (the switch of the
        wrappers in ``invariant_scopes``)."""
        return self.mode is ExpertsMode.TARGET and self.batch_invariant

    @property
    def invariant_linears_active(self) -> bool:
        """True while plain linears run the invariant GEMM kernel: in a batch-invariant
        target forward, and in draft forwards with ``invariant_draft_linears``."""
        if self.mode is ExpertsMode.DRAFT:
            return self.invariant_draft_linears
        return self.invariant_active

    @contextlib.contextmanager
    def running(self, mode: ExpertsMode) -> Iterator[None]:
        """Run the experts modules in ``mode`` for the duration of the block."""
        previous = self.mode
        self.mode = mode
        try:
            yield
        finally:
            self.mode = previous

    def record_routing(self, enabled: bool = True) -> None:
        """Start (or stop) recording the target's needed experts per layer and forward.

        While recording, ``routing_trace[layer][step]`` lists the unique experts the target
        needed in that layer at each target forward: the trace specter-cache's Belady bound
        and policy replay take. Starting discards a previous trace.
        """
        self.routing_trace = [[] for _ in range(self.cache.num_layers)] if enabled else None
