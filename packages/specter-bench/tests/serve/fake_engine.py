"""An in-process engine for the server's tests: scripted text, timed steps, cancellation.

``FakeEngine`` answers every prompt with ``script`` (cycled), ``tokens_per_step`` characters
a step (one token per character), ``step_s`` seconds a step; it records the generations it
started, so tests can check that a cancel reached the engine. Its ``batch_session()`` runs
the same script for several sequences at once, one step for all of them at a time
(``step_s`` a step, whatever the batch), up to ``max_batch``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from specter_bench.serve.engine import GenerationChunk
from specter_spec import BatchFullError, SamplingConfig

EOS = 1


class FakeTokenizer:
    """One token per character (id = code point + 2); id 1 is EOS ("<eos>")."""

    eos_token_id = EOS

    def __init__(self, chat_template: str | None = None) -> None:
        self.chat_template = chat_template

    def __len__(self) -> int:
        return 0x110000 + 2

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) + 2 for c in text]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join("<eos>" if i == EOS else chr(i - 2) for i in ids if i >= EOS)

    def apply_chat_template(
        self, messages: list[dict[str, str]], *, chat_template: str, **kwargs: Any
    ) -> str:
        rendered = "".join(f"<{m['role']}>{m['content']}" for m in messages)
        return rendered + "<assistant>"


class FakeGeneration:
    def __init__(self, engine: FakeEngine, prompt: list[int], max_new_tokens: int, **kw: Any):
        self.engine = engine
        self.prompt = prompt
        self.max_new_tokens = max_new_tokens
        self.kwargs = kw
        self.token_ids: list[int] = []
        self.text = ""
        self.stop_reason: str | None = None
        self.stats: dict[str, Any] = {}
        self.cancelled = threading.Event()
        self.finished = threading.Event()

    def cancel(self) -> None:
        self.cancelled.set()

    def __iter__(self) -> Iterator[GenerationChunk]:
        engine = self.engine
        if engine.fail_with is not None:
            raise engine.fail_with
        script = engine.script
        stops = self.kwargs.get("stop") or []
        try:
            while len(self.token_ids) < self.max_new_tokens:
                if self.cancelled.is_set():
                    self.stop_reason = "cancelled"
                    return
                time.sleep(engine.step_s)
                room = self.max_new_tokens - len(self.token_ids)
                step = []
                for _ in range(min(engine.tokens_per_step, room)):
                    i = len(self.token_ids) + len(step)
                    step.append(EOS if i == engine.eos_at else ord(script[i % len(script)]) + 2)
                    if step[-1] in stops:
                        break
                self.token_ids += step
                text = engine.tokenizer.decode(step)
                self.text += text
                yield GenerationChunk(step, text)
                if step[-1] in stops:
                    self.stop_reason = "stop_token"
                    return
            self.stop_reason = "max_new_tokens"
        finally:
            self.stats = {
                "new_tokens": len(self.token_ids),
                "proposed": 4,
                "accepted": 3,
                "acceptance_rate": 0.75,
                "mean_depth": 4.0,
                "hit_rate": 0.5,
                "prefetch_precision": 0.9,
                "prefetch_recall": 0.8,
                "bytes_moved": 1000,
            }
            self.finished.set()


class FakeBatchChunk:
    def __init__(self, index, token_ids, text, finished, finish_reason):
        self.index = index
        self.token_ids = token_ids
        self.text = text
        self.finished = finished
        self.finish_reason = finish_reason


class FakeBatchSession:
    """The scripted engine's running batch: ``add``/``step``/``cancel``/``stats``.

    Attributes:
        peak: the most sequences that were active in one step.
        cancelled: ids of the sequences cancelled.
        steps: the steps run.
    """

    def __init__(self, engine: FakeEngine) -> None:
        self.engine = engine
        self.sequences: dict[int, dict[str, Any]] = {}
        self.leaving: set[int] = set()
        self.finished: dict[int, dict[str, Any]] = {}
        self.peak = 0
        self.cancelled: list[int] = []
        self.steps = 0
        self._next = 0

    @property
    def active(self) -> int:
        return len(self.sequences)

    def add(self, prompt, *, max_new_tokens, sampling=None, stop_token_ids=None) -> int:
        if len(self.sequences) >= self.engine.max_batch:
            raise BatchFullError(f"{self.engine.max_batch} sequences are active")
        if self.engine.fail_with is not None:
            raise self.engine.fail_with
        seq = self._next
        self._next += 1
        self.sequences[seq] = {"n": max_new_tokens, "made": 0, "stops": stop_token_ids or []}
        return seq

    def cancel(self, seq_id: int) -> None:
        self.cancelled.append(seq_id)
        self.leaving.add(seq_id)

    def stats(self, seq_id: int) -> dict[str, Any]:
        return dict(self.finished.get(seq_id) or {"new_tokens": 0})

    def step(self) -> list[FakeBatchChunk]:
        engine = self.engine
        for seq in self.leaving:  # cancelled sequences leave at the boundary
            state = self.sequences.pop(seq, None)
            if state is not None:
                self.finished[seq] = {"new_tokens": state["made"], "acceptance_rate": 0.5}
        self.leaving.clear()
        if not self.sequences:  # only leaving ones: nothing runs
            return []
        if engine.fail_step is not None:
            raise engine.fail_step
        self.peak = max(self.peak, len(self.sequences))
        self.steps += 1
        time.sleep(engine.step_s)
        chunks = []
        script = engine.script
        for seq, state in list(self.sequences.items()):
            room = state["n"] - state["made"]
            step: list[int] = []
            for _ in range(min(engine.tokens_per_step, room)):
                i = state["made"] + len(step)
                step.append(EOS if i == engine.eos_at else ord(script[i % len(script)]) + 2)
                if step[-1] in state["stops"]:
                    break
            state["made"] += len(step)
            reason = None
            if step and step[-1] in state["stops"]:
                reason = "stop_token"
            elif state["made"] >= state["n"]:
                reason = "max_new_tokens"
            chunks.append(
                FakeBatchChunk(seq, step, engine.tokenizer.decode(step), reason is not None, reason)
            )
            if reason is not None:
                del self.sequences[seq]
                self.finished[seq] = {"new_tokens": state["made"], "acceptance_rate": 0.5}
        return chunks


class FakeEngine:
    """A scripted engine (see the module docstring).

    Args:
        script: the text every generation repeats.
        step_s: seconds per step.
        tokens_per_step: tokens a step commits.
        eos_at: the index of the generated token that is EOS (None: never).
        max_positions: the context length.
    """

    def __init__(
        self,
        script: str = "hello world. ",
        *,
        step_s: float = 0.0,
        tokens_per_step: int = 1,
        eos_at: int | None = None,
        max_positions: int = 256,
        chat_template: str | None = None,
        depth: bool = True,
        max_batch: int = 1,
    ) -> None:
        self.script = script
        self.step_s = step_s
        self.tokens_per_step = tokens_per_step
        self.eos_at = eos_at
        self.max_positions = max_positions
        self.reserved_positions = 4
        self.tokenizer = FakeTokenizer(chat_template)
        self.fail_with: Exception | None = None
        self.fail_step: Exception | None = None
        self.generations: list[FakeGeneration] = []
        self.max_batch = max_batch
        self.sessions: list[FakeBatchSession] = []
        if not depth:
            self.generate = self._generate_without_depth  # type: ignore[method-assign]

    def generate(
        self,
        prompt: str | Sequence[int],
        *,
        max_new_tokens: int,
        sampling: SamplingConfig | None = None,
        stop_token_ids: Sequence[int] | None = None,
        depth: int | None = None,
    ) -> FakeGeneration:
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        generation = FakeGeneration(
            self, ids, max_new_tokens, sampling=sampling, stop=stop_token_ids, depth=depth
        )
        self.generations.append(generation)
        return generation

    def batch_session(self) -> FakeBatchSession:
        session = FakeBatchSession(self)
        self.sessions.append(session)
        return session

    def _generate_without_depth(
        self,
        prompt: str | Sequence[int],
        *,
        max_new_tokens: int,
        sampling: SamplingConfig | None = None,
        stop_token_ids: Sequence[int] | None = None,
    ) -> FakeGeneration:
        return FakeEngine.generate(
            self,
            prompt,
            max_new_tokens=max_new_tokens,
            sampling=sampling,
            stop_token_ids=stop_token_ids,
        )
