"""One batched decode of B prompts, whatever the system, and how it is timed.

Every system of the ``batch`` experiment is timed the same way, from the host: each
sequence's tokens are stamped with ``time.perf_counter()`` when they reach the host. A
sequence's first tokens end its prefill (the engine: prefill and first decode step; for
transformers: the prefill, which yields the first token). Its TPOT is the time from its
first tokens to its last over the tokens after the first ones. The batch's decode
throughput is every sequence's tokens after its first ones over the time from the batch's
first tokens to its last; the end-to-end throughput counts every token over the time from
the call to the last token (prefill included).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BatchRun", "SequenceClock", "run_engine_batch"]


class SequenceClock:
    """Host stamps of the tokens of ``batch_size`` sequences, as they arrive.

    Args:
        batch_size: sequences in the batch.
        started: ``time.perf_counter()`` at the call.
    """

    def __init__(self, batch_size: int, started: float) -> None:
        self.started = started
        self.first: list[float | None] = [None] * batch_size
        self.first_tokens = [0] * batch_size
        self.last: list[float | None] = [None] * batch_size
        self.tokens: list[list[int]] = [[] for _ in range(batch_size)]

    def stamp(self, index: int, token_ids: Sequence[int], at: float | None = None) -> None:
        """Sequence ``index`` received ``token_ids`` (now, or at ``at``)."""
        if not token_ids:
            return
        now = time.perf_counter() if at is None else at
        if self.first[index] is None:
            self.first[index] = now
            self.first_tokens[index] = len(token_ids)
        self.last[index] = now
        self.tokens[index].extend(int(t) for t in token_ids)

    def tpot_s(self) -> list[float | None]:
        """Per sequence: seconds per token after its first tokens (None: none after them)."""
        out: list[float | None] = []
        for first, last, tokens, head in zip(
            self.first, self.last, self.tokens, self.first_tokens, strict=True
        ):
            later = len(tokens) - head
            out.append((last - first) / later if first is not None and later > 0 else None)
        return out

    def window(self) -> tuple[float, float, int]:
        """``(prefill_s, decode_s, decode_tokens)``: the call to the batch's first tokens,
        from them to its last token, and the tokens after each sequence's first ones."""
        firsts = [f for f in self.first if f is not None]
        lasts = [t for t in self.last if t is not None]
        if not firsts:
            return time.perf_counter() - self.started, 0.0, 0
        later = sum(len(t) - h for t, h in zip(self.tokens, self.first_tokens, strict=True))
        return min(firsts) - self.started, max(lasts) - min(firsts), later


@dataclass
class BatchRun:
    """One batched decode.

    Attributes:
        system: the system's name.
        tokens: each sequence's generated token ids, in prompt order.
        prefill_s: from the call to the batch's first tokens.
        decode_s: from the batch's first tokens to its last.
        decode_tokens: tokens after each sequence's first ones, summed over sequences.
        tpot_s: per sequence, seconds per token after its first tokens.
        peak_gpu_bytes: ``torch.cuda.max_memory_allocated`` over the decode (None on a CPU).
        stats: the batch's statistics as the system reports them (the engine's
            ``BatchGeneration.stats``; JSON values only).
        sequence_stats: per sequence, the system's statistics (the engine's per-sequence
            ``stats``), or empty.
        settings: how the system was configured.
        run_index: which of the cell's repeated runs this is.
    """

    system: str
    tokens: list[list[int]]
    prefill_s: float
    decode_s: float
    decode_tokens: int
    tpot_s: list[float | None]
    peak_gpu_bytes: int | None = None
    stats: dict[str, Any] = field(default_factory=dict)
    sequence_stats: list[dict[str, Any]] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    run_index: int = 0

    @property
    def batch_size(self) -> int:
        return len(self.tokens)

    @property
    def mean_tpot_s(self) -> float | None:
        """The mean over sequences of their TPOT (None: no sequence decoded past its first
        tokens)."""
        known = [t for t in self.tpot_s if t is not None]
        return statistics.fmean(known) if known else None

    @property
    def throughput(self) -> float | None:
        """Decode throughput, tokens per second over the whole batch (prefill excluded)."""
        return self.decode_tokens / self.decode_s if self.decode_s > 0 else None

    @property
    def end_to_end_throughput(self) -> float | None:
        """Every generated token over the time from the call to the last token."""
        total = self.prefill_s + self.decode_s
        return sum(len(t) for t in self.tokens) / total if total > 0 else None


def json_values(stats: Any) -> Any:
    """``stats`` with only JSON values kept (dicts and lists walked; others dropped)."""
    if isinstance(stats, dict):
        out = {}
        for key, value in stats.items():
            kept = json_values(value)
            if kept is not _DROP:
                out[str(key)] = kept
        return out
    if isinstance(stats, list | tuple):
        return [v for v in (json_values(x) for x in stats) if v is not _DROP]
    if stats is None or isinstance(stats, bool | int | float | str):
        return stats
    return _DROP


_DROP = object()


def run_engine_batch(
    engine: Any,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    system: str,
    settings: dict[str, Any] | None = None,
) -> BatchRun:
    """Greedy-decode ``prompts`` together with ``engine.generate_batch`` (no stop token:
    every sequence decodes ``max_new_tokens`` tokens), timed from the host.

    Args:
        engine: a ``specter_models.Engine`` built with ``max_batch >= len(prompts)``.
        prompts: the prompts' token ids.
        max_new_tokens: tokens per sequence.
        system: the name the run is recorded under.
        settings: how the system was configured (recorded).
    """
    import torch

    cuda = str(getattr(engine, "device", "cpu")).startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    clock = SequenceClock(len(prompts), started)
    generation = engine.generate_batch(
        [list(p) for p in prompts], max_new_tokens=max_new_tokens, stop_token_ids=[]
    )
    for chunk in generation:
        clock.stamp(chunk.index, chunk.token_ids)
    prefill_s, decode_s, decode_tokens = clock.window()
    results: Iterable[Any] = getattr(generation, "results", None) or []
    return BatchRun(
        system=system,
        tokens=clock.tokens,
        prefill_s=prefill_s,
        decode_s=decode_s,
        decode_tokens=decode_tokens,
        tpot_s=clock.tpot_s(),
        peak_gpu_bytes=torch.cuda.max_memory_allocated() if cuda else None,
        stats=json_values(dict(getattr(generation, "stats", None) or {})),
        sequence_stats=[json_values(dict(getattr(r, "stats", None) or {})) for r in results],
        settings=dict(settings or {}),
    )
