"""Continuous batching on an engine: sequences join and leave at step boundaries.

``Engine.batch_session()`` returns a :class:`BatchSession` over specter-spec's
``BatchedSpecController`` and the model's KV slots (``batch_adapters``): ``add`` prefills a
sequence into a free slot, ``step`` decodes every active sequence once (one batched draft
pass, one batched verification) and returns their new text, ``cancel`` makes one leave at
the next step. ``Engine.generate_batch`` is built on it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from specter_models.batch_adapters import BatchedDraft, BatchedSlots, BatchedTarget
from specter_models.engine.decode_window import DecodeWindow
from specter_models.experts_runtime import ExpertsMode
from specter_spec import BatchedSpecController, SamplingConfig

__all__ = ["BatchChunk", "BatchSession", "batch_summary", "sequence_summary"]


@dataclass(frozen=True)
class BatchChunk:
    """What one step committed for one sequence.

    Attributes:
        index: the sequence: ``BatchSession.add``'s id (``Engine.generate_batch``: the
            prompt's position in its list).
        token_ids: the tokens it committed in the step (empty when it leaves without any).
        text: the new decoded suffix of its text (tokens that merge into one character
            appear once it is complete; a finished sequence's last chunk holds the rest).
        finished: whether it left the batch after this step.
        finish_reason: ``"stop_token"``, ``"max_new_tokens"`` or ``"cancelled"`` once
            finished, else None.
    """

    index: int
    token_ids: list[int]
    text: str
    finished: bool
    finish_reason: str | None


def sequence_summary(seq: Any) -> dict[str, Any]:
    """One sequence's statistics (specter-spec's ``BatchSequence``): its tokens,
    acceptance, depth and times (the steps it took part in; a step's time is shared by the
    sequences that ran in it)."""
    stats = seq.stats
    tokens = stats.new_tokens
    return {
        "prompt_tokens": seq.prompt_length,
        "new_tokens": tokens,
        "iterations": stats.num_iterations,
        "acceptance_rate": stats.acceptance_rate,
        "accepted_per_iteration": stats.mean_accepted_per_iteration,
        "mean_depth": stats.mean_depth,
        "prefill_ms": 1e3 * stats.prefill_time_s,
        "decode_s": stats.decode_time_s,
        "tpot_ms": 1e3 * stats.tpot_s if stats.tpot_s is not None else None,
        "stop_reason": seq.finish_reason,
    }


def batch_summary(
    controller: BatchedSpecController,
    slots: BatchedSlots,
    loaded: Any,
    seq_ids: Sequence[int],
    peak_gpu_bytes: int | None,
) -> dict[str, Any]:
    """The batch's statistics: steps, wall time, tokens, mean active batch, acceptance per
    sequence, the working set per MoE layer (distinct experts a forward needs, mean over
    forwards, target and draft), the cache's totals and what the packed forwards' CUDA graphs
    did (None where they are off)."""
    history = controller.history
    steps = len(history)
    wall = sum(record.time_s for record in history)
    tokens = sum(record.committed for record in history)
    sequences = [controller.sequence(i) for i in seq_ids]
    cache = loaded.cache.stats()["total"]  # one host sync, after decoding
    working = slots.working_set
    return {
        "max_batch": controller.max_batch,
        "sequences": len(sequences),
        "steps": steps,
        "wall_s": wall,
        "prefill_s": sum(seq.stats.prefill_time_s for seq in sequences),
        "tokens_out": tokens,
        "tokens_per_s": tokens / wall if wall > 0 else None,
        "mean_active_batch": sum(r.active for r in history) / steps if steps else None,
        "mean_depth": sum(r.depth for r in history) / steps if steps else None,
        "rows_per_step": sum(r.rows for r in history) / steps if steps else None,
        "speculation": speculation_said(controller.draft is not None, [r.depth for r in history]),
        "acceptance": [seq.stats.acceptance_rate for seq in sequences],
        "working_set": working.as_dict(),
        "working_set_target_per_layer": working.mean_per_layer(ExpertsMode.TARGET),
        "working_set_draft_per_layer": working.mean_per_layer(ExpertsMode.DRAFT),
        "hit_rate": cache["hit_rate"],
        "h2d_mb_per_token": cache["bytes_moved"] / 1e6 / tokens if tokens else None,
        "slots_per_layer": loaded.memory.plan.slots_per_layer,
        "num_experts": loaded.memory.plan.num_experts,
        "peak_gpu_memory_gb": peak_gpu_bytes / 1e9 if peak_gpu_bytes else None,
        "device": str(loaded.device),
        "graphs": None if slots.packed.graphs is None else slots.packed.graphs.stats.as_dict(),
    }


def speculation_said(drafts: bool, depths: Sequence[int]) -> str:
    """What the batch's statistics say of speculation, from each step's K: plain decoding,
    on, or off (K = 0: the adaptive depth's choice, or a step whose sequences had no
    budget left to draft for) at some or every step."""
    if not drafts:
        return "off (plain decoding)"
    plain = sum(depth == 0 for depth in depths)
    if depths and plain == len(depths):
        return "off (K = 0 at every step)"
    if plain:
        return f"on (K = 0 at {plain} of {len(depths)} steps)"
    return "on"


class BatchSession:
    """Sequences decoded together on one engine; built by ``Engine.batch_session()``.

    Args:
        engine: the engine (its model, tokenizer, stop tokens and batch depth policy).
        slots: the model's batched KV slots.
        depth_policy: K, or the engine's batched adaptive depth.
        speculate: whether the draft runs (False: batched plain decoding).
        prompt_ids: the engine's prompt checks (text or ids -> ids, raising on bad ones).

    Attributes:
        controller: specter-spec's ``BatchedSpecController``.
    """

    def __init__(
        self,
        engine: Any,
        slots: BatchedSlots,
        depth_policy: Any,
        *,
        speculate: bool,
        prompt_ids: Callable[[str | Sequence[int], int], list[int]],
    ) -> None:
        loaded = engine.model
        self._engine = engine
        self._loaded = loaded
        self._slots = slots
        self._prompt_ids = prompt_ids
        self._tokenizer = engine.tokenizer
        self._cuda = engine.device.startswith("cuda")
        observer = DecodeWindow(
            loaded.cache, loaded.prefetcher, streamed_plain=engine._streamed_plain
        )
        slots.working_set.reset()
        self.controller = BatchedSpecController(
            BatchedDraft(slots) if speculate else None,
            BatchedTarget(slots),
            cache=observer,
            depth=depth_policy if speculate else 0,
        )
        self._shown: dict[int, str] = {}
        self._ids: list[int] = []
        if self._cuda:
            torch.cuda.reset_peak_memory_stats()

    @property
    def active(self) -> int:
        """Sequences in the batch."""
        return self.controller.active

    @property
    def max_batch(self) -> int:
        """The most sequences decoded at once (``BatchConfig.max_batch``)."""
        return self.controller.max_batch

    def add(
        self,
        prompt: str | Sequence[int],
        *,
        max_new_tokens: int,
        sampling: SamplingConfig | None = None,
        stop_token_ids: Sequence[int] | None = None,
    ) -> int:
        """Prefill ``prompt`` into a free slot; it decodes from the next ``step`` on.

        Args:
            prompt: text (the engine's tokenizer encodes it) or token ids.
            max_new_tokens: the most tokens it may generate (>= 1).
            sampling: its decoding (default greedy); its ``seed`` seeds its own generator.
            stop_token_ids: tokens that end it (default: the engine's end of sequence).

        Returns:
            Its id (0, 1, ... in the order of ``add``).

        Raises:
            BatchFullError: ``max_batch`` sequences are active.
            ValueError: an empty prompt, a bad ``max_new_tokens``, or a prompt and budget
                the KV slot cannot hold.
        """
        ids = self._prompt_ids(prompt, max_new_tokens)
        stop = self._engine._stop_ids if stop_token_ids is None else list(stop_token_ids)
        seq_id = self.controller.add(
            ids, max_new_tokens, sampling=sampling or SamplingConfig.greedy(), stop_token_ids=stop
        )
        self._shown[seq_id] = ""
        self._ids.append(seq_id)
        return seq_id

    def step(self, *, with_text: bool = True) -> list[BatchChunk]:
        """One decoding step of every active sequence (see the module docstring).

        Args:
            with_text: decode each sequence's new text (False: ``text`` stays empty).

        Returns:
            A chunk per sequence that committed tokens or left.
        """
        chunks = []
        for event in self.controller.step():
            text = self._new_text(event.seq_id, event.finished) if with_text else ""
            chunks.append(
                BatchChunk(event.seq_id, event.token_ids, text, event.finished, event.finish_reason)
            )
        return chunks

    def cancel(self, seq_id: int) -> None:
        """Make sequence ``seq_id`` leave at the next step (its tokens so far are kept).

        Raises:
            KeyError: no such sequence.
        """
        self.controller.cancel(seq_id)

    def forget(self, seq_id: int) -> None:
        """Drop finished sequence ``seq_id``'s tokens and statistics (a long-running
        session's memory; ``batch_stats`` then leaves it out).

        Raises:
            KeyError: no such sequence.
            RuntimeError: it is still in the batch.
        """
        self.controller.forget(seq_id)
        self._ids.remove(seq_id)
        self._shown.pop(seq_id, None)

    def token_ids(self, seq_id: int) -> list[int]:
        """Sequence ``seq_id``'s generated tokens so far."""
        return list(self.controller.sequence(seq_id).tokens)

    def text(self, seq_id: int) -> str:
        """Sequence ``seq_id``'s generated text so far."""
        return self._tokenizer.decode(self.token_ids(seq_id))

    def stats(self, seq_id: int) -> dict[str, Any]:
        """Sequence ``seq_id``'s statistics (``sequence_summary``)."""
        return sequence_summary(self.controller.sequence(seq_id))

    def batch_stats(self, seq_ids: Sequence[int] | None = None) -> dict[str, Any]:
        """The batch's statistics over ``seq_ids`` (default: every sequence added)."""
        peak = torch.cuda.max_memory_allocated() if self._cuda else None
        chosen = self._ids if seq_ids is None else list(seq_ids)
        return batch_summary(self.controller, self._slots, self._loaded, chosen, peak)

    def _new_text(self, seq_id: int, finished: bool) -> str:
        """The suffix of the sequence's text not handed out yet: complete characters only,
        everything once it finished."""
        decoded = self.text(seq_id)
        shown = self._shown[seq_id]
        if not decoded.startswith(shown):
            return ""
        if decoded.endswith("\ufffd") and not finished:
            return ""
        self._shown[seq_id] = decoded
        return decoded[len(shown) :]
