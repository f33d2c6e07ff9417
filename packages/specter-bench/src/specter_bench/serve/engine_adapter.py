"""A :class:`~specter_bench.serve.engine.ServingEngine` over ``specter generate``'s loading path.

Loads the model as ``specter generate`` does (the built-in demo's settings, the miss path
and fills, CUDA graphs captured ahead) and decodes each request with a fresh
``SpecController`` over the one loaded model. Hot sets chosen on a prompt are not part of
it: a server has no prompt at load time.
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from specter_bench.serve.engine import GenerationChunk
from specter_spec import FixedDepth, SamplingConfig, SpecController

__all__ = ["AdapterEngine", "AdapterGeneration"]


class AdapterGeneration:
    """One request's decode: chunks of one token each, decoded text as complete characters.

    Attributes:
        token_ids: tokens generated so far (prompt excluded).
        text: their decoded text so far.
        stop_reason: None while running, then ``"stop_token"``, ``"max_new_tokens"`` or
            ``"cancelled"``.
        stats: the generation's statistics once iteration ends.
    """

    def __init__(self, engine: AdapterEngine, stream: Any) -> None:
        self._engine = engine
        self._stream = stream
        self._cancelled = threading.Event()
        self.token_ids: list[int] = []
        self.text = ""
        self.stop_reason: str | None = None
        self.stats: dict[str, Any] = {}

    def cancel(self) -> None:
        """Stop at the next step boundary (safe from any thread)."""
        self._cancelled.set()

    def __iter__(self) -> Iterator[GenerationChunk]:
        tokenizer = self._engine.tokenizer
        pending: list[int] = []
        for token in self._stream:
            self.token_ids.append(token)
            pending.append(token)
            decoded = tokenizer.decode(self.token_ids)
            if decoded.startswith(self.text) and not decoded.endswith("\ufffd"):
                chunk = GenerationChunk(pending, decoded[len(self.text) :])
                self.text, pending = decoded, []
                yield chunk
            if self._cancelled.is_set():
                self.stop_reason = "cancelled"
                break
        final = tokenizer.decode(self.token_ids)
        if pending or final != self.text:
            tail = final[len(self.text) :] if final.startswith(self.text) else ""
            self.text = final
            yield GenerationChunk(pending, tail)
        self.stop_reason = self.stop_reason or self._stream.stop_reason
        self.stats = self._engine.statistics(self._stream.stats)


class AdapterEngine:
    """The loaded model and its decoding settings, behind the server's engine protocol.

    Args:
        args: the ``specter serve`` arguments (model, device, memory and depth options).
        log: where loading messages go.
    """

    def __init__(self, args: argparse.Namespace, log: Any = None) -> None:
        from specter_bench.bench_command import parse_dtype
        from specter_bench.cli import resolve_device
        from specter_bench.engine_systems import make_depth_policy
        from specter_bench.model_loading import (
            EngineOptions,
            load_engine,
            load_tokenizer,
            model_config,
        )
        from specter_bench.text_generation import (
            apply_demo_defaults,
            capture_decode_graphs,
            generate_engine_choices,
        )

        log = log or (lambda message: print(message, file=sys.stderr))
        device = resolve_device(args.device)
        dtype = parse_dtype(None, device)
        config = model_config(args.model)
        num_experts = int(
            getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None) or 1
        )
        if args.slots_per_layer is not None and args.gpu_memory_gb is not None:
            raise ValueError("give --gpu-memory-gb or --slots-per-layer, not both.")
        if apply_demo_defaults(args, num_experts):
            log(
                f"demo settings: depth {args.depth}, {args.slots_per_layer} of {num_experts} "
                "expert slots per layer"
            )
        self.max_positions = int(getattr(config, "max_position_embeddings", 0) or 4096)
        self.tokenizer = load_tokenizer(args.model, int(config.vocab_size))
        self.speculate = args.depth != 0
        budgeted = args.gpu_memory_gb is not None or args.slots_per_layer is not None
        args.miss_path, args.stream_fills = generate_engine_choices(
            args.miss_path,
            getattr(args, "stream_fills", None),
            budgeted=budgeted,
            speculate=self.speculate,
        )
        self.max_depth = 16 if args.depth == "auto" else int(args.depth)
        log(f"loading {args.model} on {device} ...")
        self.model = load_engine(
            args.model,
            budget_gb=args.gpu_memory_gb,
            slots_per_layer=args.slots_per_layer,
            with_draft=self.speculate,
            policy="predictive" if self.speculate else "lru",
            device=device,
            dtype=dtype,
            seed=args.weights_seed,
            max_seq_len=self.max_positions,
            options=EngineOptions.from_args(args),
        )
        self.streamed_plain = not self.speculate and args.miss_path == "stream"
        self.depth_policy = make_depth_policy(args.depth, self.max_depth)
        capture_decode_graphs(self.model, prompt_length=1, speculate=self.speculate)
        log(f"loaded {self.model!r}")

    def generate(
        self,
        prompt: str | Sequence[int],
        *,
        max_new_tokens: int,
        sampling: SamplingConfig | None = None,
        stop_token_ids: Sequence[int] | None = None,
        depth: int | None = None,
    ) -> AdapterGeneration:
        """Start one generation (decoding runs as the result is iterated).

        Raises:
            ValueError: a depth other than 0 where no draft is loaded.
        """
        from specter_bench.engine_systems import DecodeWindow

        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        policy: Any = self.depth_policy
        if depth is not None:
            if depth > 0 and not self.speculate:
                raise ValueError(
                    f"depth {depth}: this server decodes without an INT4 draft (started with "
                    "--depth 0); ask for depth 0 or leave depth out."
                )
            policy = FixedDepth(depth)
        self.model.reset()
        controller = SpecController(
            self.model.draft if self.speculate else None,
            self.model.target,
            cache=DecodeWindow(
                self.model.cache, self.model.prefetcher, streamed_plain=self.streamed_plain
            ),
            depth=policy,
            sampling=sampling or SamplingConfig.greedy(),
        )
        stream = controller.stream(ids, max_new_tokens, stop_token_ids=stop_token_ids or ())
        return AdapterGeneration(self, stream)

    def statistics(self, stats: Any) -> dict[str, Any]:
        """``specter generate``'s statistics of one generation, with the raw counts."""
        from specter_bench.text_generation import generation_summary

        summary = generation_summary(self.model, stats, None)
        cache = self.model.cache.stats()["total"]
        summary.update(
            proposed=stats.proposed,
            accepted=stats.accepted,
            bytes_moved=cache["bytes_moved"],
            prompt_tokens=stats.prompt_length,
        )
        return summary
