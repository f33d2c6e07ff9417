"""Several completions decoded together: ``Engine.generate_batch``'s result."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from specter_models.engine.batch_session import BatchChunk, BatchSession
from specter_spec import SamplingConfig

__all__ = ["BatchGeneration", "BatchResult"]


@dataclass
class BatchResult:
    """One prompt's completion in a batch.

    Attributes:
        token_ids: its generated token ids (prompt excluded).
        text: their decoded text.
        stop_reason: ``"stop_token"``, ``"max_new_tokens"`` or ``"cancelled"``.
        stats: its statistics (``batch_session.sequence_summary``).
    """

    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    stop_reason: str | None = None
    stats: dict[str, Any] | None = None


class BatchGeneration:
    """Completions of several prompts decoded together; iterate it for
    :class:`~specter_models.engine.batch_session.BatchChunk` s (``index``: the prompt's
    position in the list). Built by ``Engine.generate_batch``.

    Iterating prefills every prompt into its slot, then steps until every sequence has
    finished; afterwards ``results`` holds one :class:`BatchResult` per prompt and
    ``stats`` the batch's statistics (``batch_session.batch_summary``).
    """

    def __init__(
        self,
        session: BatchSession,
        prompts: Sequence[list[int]],
        max_new_tokens: Sequence[int],
        sampling: Sequence[SamplingConfig | None],
        stop_token_ids: Sequence[int] | None,
        engine_stats: dict[str, Any],
    ) -> None:
        self.session = session
        self._requests = list(zip(prompts, max_new_tokens, sampling, strict=True))
        self._stop = stop_token_ids
        self._engine_stats = engine_stats
        self._ids: list[int] = []
        self._started = False
        self.results: list[BatchResult] = [BatchResult() for _ in self._requests]
        self.stats: dict[str, Any] | None = None

    def cancel(self, index: int | None = None) -> None:
        """Make prompt ``index``'s sequence (None: every one) leave at the next step.

        Raises:
            IndexError: no such prompt, or the generation has not started.
        """
        if not self._ids:
            raise IndexError("cancel() before the generation started: iterate it first")
        if index is not None and not 0 <= index < len(self._ids):
            raise IndexError(f"no prompt {index}: this batch has {len(self._ids)}")
        for seq_id in self._ids if index is None else [self._ids[index]]:
            self.session.cancel(seq_id)

    def __iter__(self) -> Iterator[BatchChunk]:
        return self._run(with_text=True)

    def result(self) -> BatchGeneration:
        """Run to the end without decoding text per step, and return this generation."""
        if not self._started:
            for _ in self._run(with_text=False):
                pass
        return self

    def _run(self, *, with_text: bool) -> Iterator[BatchChunk]:
        if self._started:
            raise RuntimeError(
                "a BatchGeneration can be iterated once; call Engine.generate_batch again."
            )
        self._started = True
        session = self.session
        for ids, budget, sampling in self._requests:
            self._ids.append(
                session.add(
                    ids, max_new_tokens=budget, sampling=sampling, stop_token_ids=self._stop
                )
            )
        where = {seq_id: index for index, seq_id in enumerate(self._ids)}
        while session.active:
            for chunk in session.step(with_text=with_text):
                index = where[chunk.index]
                if chunk.finished:
                    self._finish(index)
                yield BatchChunk(
                    index, chunk.token_ids, chunk.text, chunk.finished, chunk.finish_reason
                )
        # The batch's own figures win over the engine's setup statistics of the same name
        # (``speculation``: what this batch did, not what the setup chose).
        self.stats = {**self._engine_stats, **session.batch_stats(self._ids)}

    def _finish(self, index: int) -> None:
        session, seq_id = self.session, self._ids[index]
        result = self.results[index]
        result.token_ids = session.token_ids(seq_id)
        result.text = session.text(seq_id)
        result.stats = session.stats(seq_id)
        result.stop_reason = result.stats["stop_reason"]


def batch_requests(
    prompts: Any,
    max_new_tokens: int | Sequence[int],
    sampling: SamplingConfig | Sequence[SamplingConfig | None] | None,
    max_batch: int,
) -> tuple[list[Any], list[int], list[SamplingConfig | None]]:
    """``Engine.generate_batch``'s arguments checked and spread to one per prompt.

    Returns:
        ``(prompts, max_new_tokens, sampling)``, lists of one entry per prompt.

    Raises:
        ValueError: no prompt, more prompts than ``max_batch``, or per-prompt lists of
            another length than the prompts.
        TypeError: a single string instead of a list of prompts, or a bad sampling entry.
    """
    if isinstance(prompts, str) or not isinstance(prompts, Sequence):
        raise TypeError(
            f"prompts must be a list of prompts (text or token ids), got "
            f"{type(prompts).__name__}; for one prompt use Engine.generate, or pass [prompt]."
        )
    prompts = list(prompts)
    if not prompts:
        raise ValueError("prompts is empty; give at least one prompt.")
    if len(prompts) > max_batch:
        raise ValueError(
            f"{len(prompts)} prompts but the engine decodes at most {max_batch} together "
            "(BatchConfig.max_batch, --max-batch); give at most that many, raise max_batch, "
            "or feed them through Engine.batch_session() as slots free up."
        )
    count = len(prompts)

    def per_prompt(value: Any, name: str) -> list[Any]:
        if isinstance(value, Sequence) and not isinstance(value, str):
            if len(value) != count:
                raise ValueError(
                    f"{name} has {len(value)} entries for {count} prompts; give one value "
                    "for all or one per prompt."
                )
            return list(value)
        return [value] * count

    budgets = per_prompt(max_new_tokens, "max_new_tokens")
    samplings = per_prompt(sampling, "sampling")
    for entry in samplings:
        if entry is not None and not isinstance(entry, SamplingConfig):
            raise TypeError(
                f"sampling must be a SamplingConfig (or one per prompt), got "
                f"{type(entry).__name__}."
            )
    return prompts, budgets, samplings
