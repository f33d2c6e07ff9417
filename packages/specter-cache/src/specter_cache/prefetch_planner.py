"""The draft-time prefetch planner: when to snapshot the routing counters and how much to load.

Three phases per draft (the paper's Cold Start, Prefetch Overlap, Final Cleanup):

1. ``COLD_START``: the first ``initial_chunk`` draft tokens are only observed; no transfer.
2. ``PREFETCH_OVERLAP``: at each chunk boundary the counters are snapshotted; the newly
   selected experts that are not resident form the next transfer batch, and the next chunk's
   length is chosen so that drafting it takes about as long as that batch's transfer:
   ``ceil(batch_bytes / bandwidth / seconds_per_draft_token)``, clamped to
   ``[min_chunk, max_chunk]`` and to the tokens left. Bandwidth and per-token draft time are
   exponential moving averages of measurements (``observe_*``).
3. ``FINAL_CLEANUP``: when the next batch fills the layer slots still free for the plan (every
   planned slot taken) or drafting reaches its depth, the last batch is issued, prediction
   stops and the counters are cleared.

The planner is pure bookkeeping (no tensors); ``SpeculativePrefetcher`` drives it.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass


class PlannerPhase(enum.Enum):
    """Where the planner is in the current draft."""

    IDLE = "idle"  # not drafting (or depth 0)
    COLD_START = "cold_start"  # observing the initial chunk
    PREFETCH_OVERLAP = "prefetch_overlap"  # chunk boundaries issue incremental batches
    FINAL_CLEANUP = "final_cleanup"  # last batch issued; no more prediction this draft


@dataclass(frozen=True)
class PlannerConfig:
    """Knobs of the prefetch planner.

    Attributes:
        initial_chunk: draft tokens observed before the first prefetch (cold start).
        min_chunk: shortest adaptive chunk, in draft tokens.
        max_chunk: longest adaptive chunk; ``None`` means up to the draft depth.
        ema_weight: weight of a new measurement in the moving averages, in ``(0, 1]``.
        initial_bandwidth: host-to-device bytes/s assumed before any transfer is measured.
        initial_token_seconds: seconds per draft token assumed before any is measured;
            ``None`` sizes the first adaptive chunk as ``initial_chunk`` tokens.
    """

    initial_chunk: int = 2
    min_chunk: int = 1
    max_chunk: int | None = None
    ema_weight: float = 0.3
    initial_bandwidth: float = 25e9
    initial_token_seconds: float | None = None

    def __post_init__(self) -> None:
        if self.initial_chunk < 1 or self.min_chunk < 1:
            raise ValueError(
                f"initial_chunk and min_chunk must be >= 1, got {self.initial_chunk}, "
                f"{self.min_chunk}"
            )
        if self.max_chunk is not None and self.max_chunk < self.min_chunk:
            raise ValueError(f"max_chunk={self.max_chunk} is below min_chunk={self.min_chunk}")
        if not 0 < self.ema_weight <= 1:
            raise ValueError(f"ema_weight must be in (0, 1], got {self.ema_weight}")
        if self.initial_bandwidth <= 0:
            raise ValueError(f"initial_bandwidth must be positive, got {self.initial_bandwidth}")
        if self.initial_token_seconds is not None and self.initial_token_seconds <= 0:
            raise ValueError(
                f"initial_token_seconds must be positive or None, got {self.initial_token_seconds}"
            )


@dataclass(frozen=True)
class BoundaryDecision:
    """What the planner decided at one chunk boundary.

    Attributes:
        tokens_done: draft tokens produced when the boundary was reached.
        batch_experts: experts in the transfer batch (all layers).
        batch_bytes: bytes of the batch.
        transfer_seconds: the batch's expected transfer time.
        next_boundary: draft-token count of the next boundary; ``None`` after cleanup.
        phase: the phase after the decision.
    """

    tokens_done: int
    batch_experts: int
    batch_bytes: int
    transfer_seconds: float
    next_boundary: int | None
    phase: PlannerPhase


class PrefetchPlanner:
    """Chunk boundaries and phases of draft-time prefetching (see module docstring).

    Args:
        config: the planner's knobs.

    Example:
        >>> planner = PrefetchPlanner(PlannerConfig(initial_chunk=2))
        >>> planner.begin_draft(depth=8)
        >>> planner.is_boundary(2)
        True
        >>> planner.observe_token_time(0.001)  # 1 ms per draft token
        >>> d = planner.decide(2, batch_experts=4, batch_bytes=100_000_000, remaining_slots=10)
        >>> d.next_boundary  # 100 MB at 25 GB/s = 4 ms = 4 tokens
        6
    """

    def __init__(self, config: PlannerConfig | None = None):
        self.config = config or PlannerConfig()
        self.phase = PlannerPhase.IDLE
        self.depth = 0
        self.next_boundary: int | None = None
        self.bandwidth = self.config.initial_bandwidth
        self.token_seconds = self.config.initial_token_seconds
        self.bandwidth_samples = 0
        self.token_samples = 0
        self.decisions: list[BoundaryDecision] = []  # of the current draft

    @property
    def predicting(self) -> bool:
        """Whether draft tokens still feed predictions (cold start or overlap)."""
        return self.phase in (PlannerPhase.COLD_START, PlannerPhase.PREFETCH_OVERLAP)

    def begin_draft(self, depth: int) -> None:
        """Start a draft of ``depth`` tokens: cold start until the initial boundary.

        Raises:
            ValueError: ``depth`` is not a non-negative int.
        """
        if not isinstance(depth, int) or isinstance(depth, bool) or depth < 0:
            raise ValueError(f"draft depth must be a non-negative int, got {depth!r}")
        self.depth = depth
        self.decisions = []
        if depth == 0:
            self.phase, self.next_boundary = PlannerPhase.IDLE, None
        else:
            self.phase = PlannerPhase.COLD_START
            self.next_boundary = min(self.config.initial_chunk, depth)

    def is_boundary(self, tokens_done: int) -> bool:
        """Whether a snapshot is due after ``tokens_done`` draft tokens."""
        return (
            self.predicting and self.next_boundary is not None and tokens_done >= self.next_boundary
        )

    def chunk_length(self, batch_bytes: int) -> int:
        """Draft tokens whose compute time matches the transfer of ``batch_bytes`` (unclamped
        by the tokens left; clamped to ``[min_chunk, max_chunk]``)."""
        cfg = self.config
        if self.token_seconds is None:
            n = cfg.initial_chunk
        else:
            n = math.ceil(batch_bytes / self.bandwidth / self.token_seconds)
        n = max(cfg.min_chunk, n)
        if cfg.max_chunk is not None:
            n = min(cfg.max_chunk, n)
        return n

    def decide(
        self,
        tokens_done: int,
        *,
        batch_experts: int,
        batch_bytes: int,
        remaining_slots: int,
        drafting_done: bool = False,
    ) -> BoundaryDecision:
        """Decide at a boundary: the next boundary, or final cleanup.

        Args:
            tokens_done: draft tokens produced so far.
            batch_experts: experts in the transfer batch formed at this boundary.
            batch_bytes: their bytes.
            remaining_slots: slots (all layers) not yet holding an expert of the current plan,
                before this batch.
            drafting_done: the draft ended here (e.g. stopped before its depth).

        Returns:
            The decision; ``phase`` is ``FINAL_CLEANUP`` when the batch fills the remaining
            slots or drafting is done, else ``PREFETCH_OVERLAP``.

        Raises:
            RuntimeError: called while not predicting.
        """
        if not self.predicting:
            raise RuntimeError(f"decide() called in phase {self.phase.value}; call begin_draft")
        transfer = batch_bytes / self.bandwidth
        if drafting_done or batch_experts >= remaining_slots or tokens_done >= self.depth:
            self.phase, self.next_boundary = PlannerPhase.FINAL_CLEANUP, None
        else:
            self.phase = PlannerPhase.PREFETCH_OVERLAP
            self.next_boundary = min(self.depth, tokens_done + self.chunk_length(batch_bytes))
        decision = BoundaryDecision(
            tokens_done, batch_experts, batch_bytes, transfer, self.next_boundary, self.phase
        )
        self.decisions.append(decision)
        return decision

    def end_draft(self) -> None:
        """Drafting is over (verification starts)."""
        self.phase, self.next_boundary = PlannerPhase.IDLE, None

    def observe_bandwidth(self, nbytes: int, seconds: float) -> None:
        """Feed one measured transfer (ignored when degenerate)."""
        if nbytes <= 0 or seconds <= 0:
            return
        self.bandwidth = self._ema(self.bandwidth, nbytes / seconds, self.bandwidth_samples)
        self.bandwidth_samples += 1

    def observe_token_time(self, seconds: float) -> None:
        """Feed one measured per-draft-token time (ignored when not positive)."""
        if seconds <= 0:
            return
        if self.token_seconds is None:
            self.token_seconds = seconds
        else:
            self.token_seconds = self._ema(self.token_seconds, seconds, self.token_samples)
        self.token_samples += 1

    def _ema(self, old: float, new: float, samples: int) -> float:
        # The first measurement replaces the assumed initial value outright.
        if samples == 0:
            return new
        w = self.config.ema_weight
        return (1 - w) * old + w * new
