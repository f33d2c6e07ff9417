"""What the server needs of an engine: the surface of ``specter_models.Engine`` it calls.

The server talks to the engine only through :class:`ServingEngine`, so the request
handling, queueing and failure paths can be tested against an in-process fake engine, and
the acceptance tests drive the real one in a ``specter serve`` subprocess.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from specter_spec import SamplingConfig

__all__ = [
    "DEFAULT_RESERVED_POSITIONS",
    "BatchSessionHandle",
    "GenerationChunk",
    "GenerationHandle",
    "ServingEngine",
    "accepts_depth",
    "context_limits",
    "eos_ids",
]

DEFAULT_RESERVED_POSITIONS = 18
"""Positions kept free past a request's last token for one verification at the deepest
adaptive depth (16 proposals, the corrected token and its successor), as ``specter
generate`` keeps them, where the engine says nothing of its depth."""


@dataclass(frozen=True)
class GenerationChunk:
    """Tokens committed by one engine step and the text they complete.

    Attributes:
        token_ids: the step's new token ids (one or more: a speculative step commits several).
        text: the new decoded suffix (possibly empty while a multi-byte character is
            incomplete).
    """

    token_ids: list[int]
    text: str


@runtime_checkable
class GenerationHandle(Protocol):
    """One running generation: iterate it for chunks; ``stats`` and ``stop_reason`` are
    final once iteration ends. ``cancel`` may be called from another thread and stops the
    generation at its next step boundary."""

    token_ids: list[int]
    text: str
    stop_reason: str | None
    stats: dict[str, Any]

    def __iter__(self) -> Iterator[Any]: ...

    def cancel(self) -> None: ...


@runtime_checkable
class BatchSessionHandle(Protocol):
    """The engine's running batch (``specter_models.Engine.batch_session()``), driven by the
    server's one worker thread for continuous batching.

    ``add`` prefills a sequence and returns its id (it joins at the next step; it raises
    ``BatchFullError`` while ``max_batch`` sequences are active); ``step`` runs one decode
    step of every active sequence and returns its chunks (``index`` the sequence's id,
    ``token_ids``, ``text``, ``finished``, ``finish_reason``); ``cancel`` makes a sequence
    leave at the next step boundary; ``stats`` is a sequence's statistics."""

    active: int

    def add(
        self,
        prompt: str | Sequence[int],
        *,
        max_new_tokens: int,
        sampling: SamplingConfig | None = None,
        stop_token_ids: Sequence[int] | None = None,
    ) -> int: ...

    def step(self) -> list[Any]: ...

    def cancel(self, seq_id: int) -> None: ...

    def stats(self, seq_id: int) -> dict[str, Any]: ...


@runtime_checkable
class ServingEngine(Protocol):
    """The part of ``specter_models.Engine`` the server uses (and, to serve with
    ``max_batch`` > 1, its ``batch_session()``: a :class:`BatchSessionHandle`)."""

    tokenizer: Any
    max_positions: int

    def generate(
        self,
        prompt: str | Sequence[int],
        *,
        max_new_tokens: int,
        sampling: SamplingConfig | None = None,
        stop_token_ids: Sequence[int] | None = None,
    ) -> GenerationHandle: ...


def context_limits(engine: ServingEngine) -> tuple[int, int]:
    """``(positions, reserved)``: the positions a request's prompt and new tokens share
    (the model's, at most what the engine's KV cache holds), and those of them kept for one
    verification at the engine's deepest depth (the engine's ``reserved_positions`` where
    it says, else from its speculation config, else 18: depth 16 and two)."""
    limits = [
        int(v)
        for v in (getattr(engine, "max_positions", None), getattr(engine, "max_seq_len", None))
        if v is not None
    ]
    positions = min(limits) if limits else 1 << 30
    reserved = getattr(engine, "reserved_positions", None)
    if reserved is None:
        speculation = getattr(getattr(engine, "config", None), "speculation", None)
        largest = getattr(speculation, "largest_depth", None)
        if getattr(engine, "depth", None) == 0:
            largest = 0
        reserved = DEFAULT_RESERVED_POSITIONS if largest is None else int(largest) + 2
    return positions, int(reserved)


def accepts_depth(engine: ServingEngine) -> bool:
    """Whether ``engine.generate`` takes a per-request ``depth`` keyword."""
    try:
        params = inspect.signature(engine.generate).parameters
    except (TypeError, ValueError):
        return False
    return "depth" in params


def eos_ids(tokenizer: Any) -> list[int]:
    """The tokenizer's end-of-sequence id as a stop-token list, as ``specter generate``
    stops on it: empty without one, and for the byte tokenizer of random-weight presets
    (whose text is noise and whose id 0 is only a BOS)."""
    from specter_bench.prompt_encoding import ByteTokenizer

    if isinstance(tokenizer, ByteTokenizer):
        return []
    eos = getattr(tokenizer, "eos_token_id", None)
    return [eos] if isinstance(eos, int) and not isinstance(eos, bool) else []
