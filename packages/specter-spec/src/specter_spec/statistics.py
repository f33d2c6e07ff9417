"""Per-iteration and per-generation statistics of speculative decoding.

The terms (proposed, accepted, accepted per iteration, correction, bonus) are
those defined in :mod:`specter_spec.acceptance`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["GenerationResult", "GenerationStats", "IterationStats"]


@dataclass(frozen=True)
class IterationStats:
    """One draft-then-verify iteration.

    Attributes:
        depth: K, the number of proposals drafted (0 = plain target decoding).
        accepted: proposals accepted by the acceptance rule (accepted per
            iteration, ``0 <= accepted <= depth``), whether or not a stop token
            or the token budget then ended generation inside them.
        bonus: True when every proposal was accepted and the extra token is a
            bonus token; False when it is a correction token.
        committed: tokens appended to the output: ``accepted + 1``, fewer only
            when a stop token or ``max_new_tokens`` ended generation inside them.
        draft_time_s: wall time of the draft phase (0 when ``depth == 0``).
        verify_time_s: wall time of the target's forward pass, acceptance and
            the host read-back of the result.
        total_time_s: wall time of the whole iteration, including KV rollback.
        verified: proposals the target verified: ``depth`` unless it verified only the
            leading rows (miss-aware row truncation, greedy only); the extra token then
            comes from the last verified row, and ``bonus`` means all verified ones were
            accepted. None is read as ``depth``.
        pipelined: a plain step (K = 0) queued while the previous plain step still ran
            (see ``SpecController(pipeline_plain=...)``): its time is the device's step
            time with the host's work hidden behind it, the steady state of a run of plain
            steps. False for every other iteration, including the first step of a run.
        first: the generation's first iteration, right after its prefill. Its times are not
            a step's: they carry the prefill's device work still queued and the first use of
            what the decode reuses (drafting can take about twice as long there as in
            later iterations).
    """

    depth: int
    accepted: int
    bonus: bool
    committed: int
    draft_time_s: float
    verify_time_s: float
    total_time_s: float
    verified: int | None = None
    pipelined: bool = False
    first: bool = False

    @classmethod
    def plain_step(
        cls, seconds: float, *, pipelined: bool = False, first: bool = False
    ) -> IterationStats:
        """A plain (K = 0) iteration of ``seconds`` that committed one token, all of its time
        in the target's step."""
        return cls(
            depth=0,
            accepted=0,
            bonus=True,
            committed=1,
            draft_time_s=0.0,
            verify_time_s=seconds,
            total_time_s=seconds,
            verified=0,
            pipelined=pipelined,
            first=first,
        )

    @property
    def verified_proposals(self) -> int:
        """Proposals the target verified: ``verified``, or ``depth`` when it is None."""
        return self.depth if self.verified is None else self.verified

    @property
    def proposed(self) -> int:
        """Proposals drafted in this iteration (equals ``depth``)."""
        return self.depth

    @property
    def correction(self) -> bool:
        """True when the iteration ended with a correction token (a proposal was rejected)."""
        return not self.bonus

    def as_dict(self) -> dict[str, Any]:
        """Plain-Python view, for JSON."""
        return {
            "depth": self.depth,
            "proposed": self.proposed,
            "accepted": self.accepted,
            "bonus": self.bonus,
            "correction": self.correction,
            "committed": self.committed,
            "draft_time_s": self.draft_time_s,
            "verify_time_s": self.verify_time_s,
            "total_time_s": self.total_time_s,
            "verified": self.verified_proposals,
            "pipelined": self.pipelined,
            "first": self.first,
        }


@dataclass
class GenerationStats:
    """Totals over one generation; ``iterations`` grows while a stream runs.

    TPOT (time per output token) is the decode wall time, the sum of the
    iterations' ``total_time_s`` (prefill excluded), divided by the number of
    generated tokens.

    Attributes:
        prompt_length: tokens in the prompt.
        prefill_time_s: wall time of running the prompt through the target
            (and the draft when it speculates).
        iterations: one record per draft-then-verify iteration, in order.
    """

    prompt_length: int
    prefill_time_s: float = 0.0
    iterations: list[IterationStats] = field(default_factory=list)

    @property
    def num_iterations(self) -> int:
        """Draft-then-verify iterations run."""
        return len(self.iterations)

    @property
    def new_tokens(self) -> int:
        """Tokens generated (committed after the prompt)."""
        return sum(it.committed for it in self.iterations)

    @property
    def proposed(self) -> int:
        """Proposals drafted in total."""
        return sum(it.proposed for it in self.iterations)

    @property
    def verified(self) -> int:
        """Proposals the target verified in total (``proposed`` unless rows were cut)."""
        return sum(it.verified_proposals for it in self.iterations)

    @property
    def accepted(self) -> int:
        """Proposals accepted in total."""
        return sum(it.accepted for it in self.iterations)

    @property
    def corrections(self) -> int:
        """Iterations that ended with a correction token."""
        return sum(it.correction for it in self.iterations)

    @property
    def bonuses(self) -> int:
        """Iterations that ended with a bonus token (all proposals accepted, K = 0 included)."""
        return sum(it.bonus for it in self.iterations)

    @property
    def draft_time_s(self) -> float:
        """Total wall time of draft phases."""
        return sum(it.draft_time_s for it in self.iterations)

    @property
    def verify_time_s(self) -> float:
        """Total wall time of verify phases."""
        return sum(it.verify_time_s for it in self.iterations)

    @property
    def decode_time_s(self) -> float:
        """Total wall time of all iterations (prefill excluded)."""
        return sum(it.total_time_s for it in self.iterations)

    @property
    def tpot_s(self) -> float | None:
        """Decode time per generated token; None before the first token."""
        tokens = self.new_tokens
        return self.decode_time_s / tokens if tokens else None

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted / proposed over the generation; None when nothing was proposed."""
        proposed = self.proposed
        return self.accepted / proposed if proposed else None

    @property
    def mean_accepted_per_iteration(self) -> float | None:
        """Mean accepted per iteration; None before the first iteration."""
        return self.accepted / self.num_iterations if self.iterations else None

    @property
    def mean_committed_per_iteration(self) -> float | None:
        """Mean tokens committed per iteration; None before the first iteration."""
        return self.new_tokens / self.num_iterations if self.iterations else None

    @property
    def mean_depth(self) -> float | None:
        """Mean depth K per iteration; None before the first iteration."""
        return self.proposed / self.num_iterations if self.iterations else None

    def as_dict(self, per_iteration: bool = True) -> dict[str, Any]:
        """Plain-Python view, for JSON.

        Args:
            per_iteration: include the list of per-iteration records.
        """
        summary: dict[str, Any] = {
            "prompt_length": self.prompt_length,
            "new_tokens": self.new_tokens,
            "iterations": self.num_iterations,
            "proposed": self.proposed,
            "verified": self.verified,
            "accepted": self.accepted,
            "corrections": self.corrections,
            "bonuses": self.bonuses,
            "acceptance_rate": self.acceptance_rate,
            "mean_accepted_per_iteration": self.mean_accepted_per_iteration,
            "mean_committed_per_iteration": self.mean_committed_per_iteration,
            "mean_depth": self.mean_depth,
            "prefill_time_s": self.prefill_time_s,
            "draft_time_s": self.draft_time_s,
            "verify_time_s": self.verify_time_s,
            "decode_time_s": self.decode_time_s,
            "tpot_s": self.tpot_s,
        }
        if per_iteration:
            summary["per_iteration"] = [it.as_dict() for it in self.iterations]
        return summary


@dataclass(frozen=True)
class GenerationResult:
    """What ``SpecController.generate`` returns.

    Attributes:
        tokens: the generated token ids (prompt excluded), a stop token included.
        stop_reason: ``"stop_token"`` or ``"max_new_tokens"``.
        stats: statistics of the generation.
    """

    tokens: list[int]
    stop_reason: str
    stats: GenerationStats

    def as_dict(self) -> dict[str, Any]:
        """Plain-Python view, for JSON."""
        return {
            "tokens": list(self.tokens),
            "stop_reason": self.stop_reason,
            **self.stats.as_dict(),
        }
