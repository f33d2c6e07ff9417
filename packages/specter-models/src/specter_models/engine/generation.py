"""One generation of the engine: streamed chunks of text, then its statistics."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from specter_models.cpu_calibration import cpu_experts_per_token, placement_split
from specter_models.kv_cache import KVCacheFullError
from specter_spec import NonFiniteLogitsError

__all__ = ["Generation", "GenerationChunk", "NonFiniteLogitsError", "generation_summary"]

_NON_FINITE_SAMPLING = "probability tensor contains either `inf`, `nan`"
"""torch.multinomial's refusal of NaN or infinite probabilities."""


@dataclass(frozen=True)
class GenerationChunk:
    """Tokens committed at one step and the text they completed.

    Attributes:
        token_ids: the new token ids (empty for the final piece of text).
        text: the new decoded suffix: tokens that merge into one character (bytes of
            UTF-8) appear once the character is complete, so it may be empty.
    """

    token_ids: list[int]
    text: str


def _stream_record(loaded: object) -> object | None:
    return getattr(getattr(loaded, "runtime", None), "stream_record", None)


def generation_summary(loaded: Any, stats: Any, peak_gpu_bytes: int | None) -> dict[str, Any]:
    """The statistics of one generation: speed, acceptance, depth, cache, memory.

    Args:
        loaded: the ``SpecterModel``.
        stats: the stream's ``specter_spec.GenerationStats``.
        peak_gpu_bytes: ``torch.cuda.max_memory_allocated`` or None on a CPU.
    """
    cache = loaded.cache.stats()["total"]  # one host sync, after generation
    cpu = getattr(getattr(loaded, "runtime", None), "cpu_experts", None)
    tokens = stats.new_tokens
    tpot = stats.tpot_s
    later = stats.iterations[1:]
    later_tokens = sum(it.committed for it in later)
    steady = sum(it.total_time_s for it in later) / later_tokens if later_tokens else None
    plan = loaded.memory.plan
    return {
        "new_tokens": tokens,
        "tpot_ms": 1e3 * tpot if tpot is not None else None,
        "tokens_per_s": 1.0 / tpot if tpot else None,
        # Decode time a token after the first iteration, which carries one-time costs
        # (the kernels' first use and compilation, the prefill's queued work).
        "steady_tpot_ms": 1e3 * steady if steady is not None else None,
        "prefill_ms": 1e3 * stats.prefill_time_s,
        # Counted in TPOT, but carries the prefill's queued work and the decode's first
        # uses: at 24 GB on one H200 about twice a later iteration.
        "first_iteration_ms": (
            1e3 * stats.iterations[0].total_time_s if stats.iterations else None
        ),
        "iterations": stats.num_iterations,
        "acceptance_rate": stats.acceptance_rate,
        "accepted_per_iteration": stats.mean_accepted_per_iteration,
        "mean_depth": stats.mean_depth,
        "hit_rate": cache["hit_rate"],
        "prefetch_precision": cache["prefetch_precision"],
        "prefetch_recall": cache["prefetch_recall"],
        "h2d_mb_per_token": cache["bytes_moved"] / 1e6 / tokens if tokens else None,
        "stall_ms_per_token": 1e3 * cache["stall_seconds"] / tokens if tokens else None,
        "miss_path": getattr(loaded, "miss_path", "load"),
        "streamed_mb_per_token": (
            cache.get("streamed_bytes", 0) / 1e6 / tokens if tokens else None
        ),
        "stream_fills": getattr(loaded, "stream_fills", 0),
        "pipelined_records": bool(getattr(_stream_record(loaded), "pipelined", False)),
        "streamed_fills": cache.get("streamed_fills", 0),
        "stream_staging": getattr(loaded, "stream_staging", 0),
        "slots_per_layer": plan.slots_per_layer,
        "hot_experts_per_layer": plan.hot_experts_per_layer,
        "draft_pruned_per_layer": plan.pruned_experts_per_layer,
        "num_experts": plan.num_experts,
        "placement": placement_split(cache, cpu),
        "cpu_experts": cpu_experts_per_token(cpu, tokens),
        "peak_gpu_memory_gb": peak_gpu_bytes / 1e9 if peak_gpu_bytes else None,
        "device": str(loaded.device),
    }


class Generation:
    """A generation in progress: iterate it for :class:`GenerationChunk` s.

    Iterating runs the decode; afterwards ``token_ids``, ``text``, ``stop_reason`` and
    ``stats`` hold the result. Built by :meth:`~specter_models.engine.Engine.generate`.

    Attributes:
        token_ids: the generated token ids so far (prompt excluded).
        text: their decoded text (complete after iteration).
        stop_reason: None while running, then ``"stop_token"``, ``"max_new_tokens"``,
            ``"cancelled"`` or ``"max_positions"`` (the KV cache filled up part-way: the
            tokens generated until then are kept).
        stats: None while running, then the statistics: :func:`generation_summary`'s keys,
            ``stop_reason`` and the engine's setup figures (hot-set choice, graph capture,
            depth warm-up, depth costs).
    """

    def __init__(
        self,
        stream: Any,
        tokenizer: Any,
        *,
        loaded: Any,
        cuda: bool,
        engine_stats: dict[str, Any],
        on_finish: Callable[[], None],
    ) -> None:
        self._stream = stream
        self._tokenizer = tokenizer
        self._loaded = loaded
        self._cuda = cuda
        self._engine_stats = engine_stats
        self._on_finish = on_finish
        self._cancelled = False
        self._full = False
        self._source = getattr(loaded, "source", None) or repr(loaded)
        self._started = False
        self.token_ids: list[int] = []
        self.text = ""
        self.stop_reason: str | None = None
        self.stats: dict[str, Any] | None = None

    def cancel(self) -> None:
        """Stop at the next step boundary (the tokens committed so far are kept)."""
        self._cancelled = True

    def __iter__(self) -> Iterator[GenerationChunk]:
        return self._run(with_text=True)

    def _run(self, *, with_text: bool) -> Iterator[GenerationChunk]:
        if self._started:
            raise RuntimeError("a Generation can be iterated once; call Engine.generate again.")
        self._started = True
        if self._cuda:
            torch.cuda.reset_peak_memory_stats()
        decode = self._tokenizer.decode
        shown = ""
        for token in self._tokens():
            self.token_ids.append(token)
            piece = ""
            if with_text:
                # Decode everything so far and hand out the new suffix: tokens that merge
                # into one character (bytes of UTF-8) appear once complete.
                decoded = decode(self.token_ids)
                if decoded.startswith(shown) and not decoded.endswith("\ufffd"):
                    piece, shown = decoded[len(shown) :], decoded
            yield GenerationChunk([token], piece)
            if self._cancelled:
                close = getattr(getattr(self._stream, "_tokens", None), "close", None)
                if callable(close):
                    close()
                break
        self.text = decode(self.token_ids)
        if with_text and self.text.startswith(shown) and len(self.text) > len(shown):
            yield GenerationChunk([], self.text[len(shown) :])
        self._finish()

    def _tokens(self) -> Iterator[int]:
        """The stream's tokens; a KV cache that fills up part-way ends it (``stop_reason``
        ``"max_positions"``), non-finite logits raise :class:`NonFiniteLogitsError`."""
        try:
            yield from self._stream
        except KVCacheFullError:
            self._full = True
        except NonFiniteLogitsError as exc:
            raise NonFiniteLogitsError(f"{self._source}: {exc}") from exc
        except RuntimeError as exc:
            if _NON_FINITE_SAMPLING not in str(exc):
                raise
            raise NonFiniteLogitsError(
                f"{self._source}: a model's logits are not finite (NaN or infinity): its "
                "weights are probably corrupt; check the checkpoint's files (sizes, "
                "checksums; download them again)."
            ) from exc

    def _finish(self) -> None:
        stream = self._stream
        self.stop_reason = stream.stop_reason or ("cancelled" if self._cancelled else None)
        if self._full:
            self.stop_reason = "max_positions"
        peak = torch.cuda.max_memory_allocated() if self._cuda else None
        self._on_finish()
        stats = generation_summary(self._loaded, stream.stats, peak)
        stats["stop_reason"] = self.stop_reason
        stats.update(self._engine_stats)
        self.stats = stats

    def result(self) -> Generation:
        """Run to the end without handing out text as it goes (no decoding per token) and
        return this generation; a generation already iterated is returned as it is."""
        if not self._started:
            for _ in self._run(with_text=False):
                pass
        return self
