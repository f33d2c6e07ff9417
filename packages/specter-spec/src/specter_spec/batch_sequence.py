"""The state of one sequence in batched decoding, and what a step reports for it."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specter_spec.sampling import SamplingConfig
from specter_spec.statistics import GenerationStats

__all__ = ["BatchEvent", "BatchFullError", "BatchSequence", "BatchStepRecord"]


class BatchFullError(RuntimeError):
    """Every KV slot holds an active sequence: no other sequence can join now."""


@dataclass(frozen=True)
class BatchEvent:
    """What one step did for one sequence.

    Attributes:
        seq_id: the sequence (``BatchedSpecController.add``'s id).
        token_ids: the tokens it committed in the step (empty for a sequence that leaves
            without committing any: cancelled, or added with no token to generate).
        finished: whether it left the batch after this step.
        finish_reason: ``"stop_token"``, ``"max_new_tokens"`` or ``"cancelled"`` once
            finished, else None.
    """

    seq_id: int
    token_ids: list[int]
    finished: bool
    finish_reason: str | None


@dataclass(frozen=True)
class BatchStepRecord:
    """One step of the whole batch.

    Attributes:
        active: sequences that decoded in the step.
        depth: the step's K (the most proposals any sequence drafted).
        rows: rows the target verified (every sequence's ``K_b + 1``).
        committed: tokens committed over the sequences.
        time_s: wall time of the step.
    """

    active: int
    depth: int
    rows: int
    committed: int
    time_s: float


@dataclass(eq=False)
class BatchSequence:
    """One sequence of a batch: its slot, committed tokens, budget and statistics.

    Attributes:
        seq_id: its id.
        slot: its KV slot in both models.
        committed: ``[P + max_new_tokens]`` int64 device buffer; the first ``n`` hold the
            prompt and the committed tokens.
        n: tokens committed so far, the prompt included.
        prompt_length: ``P``.
        max_new_tokens: its budget of new tokens.
        stop: its stop tokens.
        sampling: greedy or sampled decoding, its own.
        generator: its random source (None: torch's global one).
        stats: its statistics (prefill time, one ``IterationStats`` per step it decoded).
        tokens: its generated tokens (host ints).
        finish_reason: None while decoding.
        cancelled: asked to leave at the next step boundary.
    """

    seq_id: int
    slot: int
    committed: torch.Tensor
    n: int
    prompt_length: int
    max_new_tokens: int
    stop: frozenset[int]
    sampling: SamplingConfig
    generator: torch.Generator | None
    stats: GenerationStats
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    cancelled: bool = False

    @property
    def generated(self) -> int:
        """Tokens generated so far."""
        return self.n - self.prompt_length

    @property
    def remaining(self) -> int:
        """Tokens it may still generate."""
        return self.max_new_tokens - self.generated

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None
