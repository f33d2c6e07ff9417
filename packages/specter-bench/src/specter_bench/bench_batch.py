"""The ``batch`` experiment: each system decodes the first B prompts together, for each B.

``specter`` and ``offload`` are one ``specter_models.Engine`` each (``offload``: depth 0, no
draft loaded, its memory as expert slots), built at the budget with room for the largest
batch (``BatchConfig.max_batch``) and decoding through ``Engine.generate_batch``; ``hf`` is
transformers' batched ``generate`` (:mod:`~specter_bench.hf_batch`). Every batch size is
warmed up (``--warmup`` unrecorded decodes of ``--warmup-tokens``) and then decoded
``--runs`` times, greedy, no stop token, each run one ``batch`` record: mean TPOT per
sequence, decode throughput of the batch, the engine's distinct experts per MoE layer per
step (target and draft), acceptance, depth, and what the engine says of speculation (on,
lowered or turned off, and why).

A largest batch whose KV cache the budget cannot hold is recorded as skipped and the engine
is built for the next smaller one; a batch size that runs out of device memory while
decoding is recorded as skipped with every larger one.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch
from tqdm import tqdm

from specter_bench.batch_run import BatchRun, run_engine_batch
from specter_bench.bench_record import ExperimentRecord
from specter_bench.bench_support import GB, BenchResult, EncodedPrompt, budget_text, pad_id
from specter_bench.experiments import Stage
from specter_bench.system_run import first_mismatch

__all__ = ["BatchStages", "batch_figures"]

Decode = Callable[[list[list[int]], int], BatchRun]


def _number(value: Any) -> float | None:
    """A figure as a float: a number, or a dict's ``mean`` (None otherwise)."""
    if isinstance(value, dict):
        value = value.get("mean")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


def batch_figures(stats: dict[str, Any], sequence_stats: Sequence[dict[str, Any]]) -> dict:
    """The figures a ``batch`` record quotes from the engine's batch statistics.

    Returns:
        ``acceptance_rate`` (the mean of the sequences', else the batch's), ``mean_depth``,
        ``distinct_experts_target`` and ``distinct_experts_draft`` (distinct experts per
        MoE layer per step, mean over steps), ``mean_active_batch``, ``steps`` and
        ``speculation`` (what the engine says of it); None where the engine reports none.
    """
    working = stats.get("working_set") or {}
    acceptance = _mean([_number(s.get("acceptance_rate")) for s in sequence_stats])
    if acceptance is None:
        acceptance = _number(stats.get("acceptance_rate"))
    return {
        "acceptance_rate": acceptance,
        "mean_depth": _number(stats.get("mean_depth")),
        "distinct_experts_target": _number(working.get("target")),
        "distinct_experts_draft": _number(working.get("draft")),
        "mean_active_batch": _number(stats.get("mean_active_batch")),
        "steps": stats.get("steps"),
        "speculation": stats.get("speculation"),
    }


class BatchStages:
    """``BenchRunner``'s ``batch`` stages (a mixin: it uses the runner's prompts, config,
    references and records)."""

    def _batch_sizes(self) -> list[int]:
        return sorted(set(self.config.batch_sizes))

    def _batch_engine(self, stage: Stage, result: BenchResult) -> tuple[Any, int]:
        """The stage's engine, built for the largest batch size the budget holds; larger
        ones are recorded as skipped. Returns ``(engine, largest batch)``.

        Raises:
            MemoryBudgetError: not even the smallest batch size fits.
        """
        from specter_models import MemoryBudgetError

        sizes = self._batch_sizes()
        system = stage.systems[0]
        for at, size in enumerate(reversed(sizes)):
            try:
                return self._build_batch_engine(stage, size), size
            except MemoryBudgetError as exc:
                if at == len(sizes) - 1:
                    raise
                self._skip(
                    result, f"{system} at B = {size}, {budget_text(stage.budget_gb)}",
                    f"the budget cannot hold a KV cache of {size} sequences: {exc}",
                    stage.budget_gb, stage.systems,
                )  # fmt: skip
        raise AssertionError("unreachable")

    def _build_batch_engine(self, stage: Stage, max_batch: int) -> Any:
        from specter_models import Engine
        from specter_models.engine.config import (
            BatchConfig,
            EngineConfig,
            LoadConfig,
            MemoryConfig,
            SpeculationConfig,
        )

        cfg = self.config
        speculate = stage.systems[0] == "specter"
        depth = cfg.depth if speculate else 0
        options = cfg.engine
        config = EngineConfig(
            load=LoadConfig(
                cfg.model,
                device=cfg.device,
                dtype=str(cfg.dtype).removeprefix("torch."),
                weights_seed=cfg.seed,
            ),
            memory=MemoryConfig(
                gpu_memory_gb=stage.budget_gb,
                max_seq_len=self.max_seq_len,
                draft_pruned=cfg.draft_pruned_per_layer if speculate else "auto",
            ),
            kernels=options.kernel_config(),
            speculation=SpeculationConfig(
                depth=depth,
                max_depth=cfg.max_depth,
                keep_draft=speculate and depth == "auto" and not cfg.fallback,
                depth_memory=False,  # every run measures from scratch
                trial_tokens=0,  # the batch's own depth policy lowers K (a trial times one)
            ),
            batch=BatchConfig(max_batch=max_batch),
        )
        calibration = (self.calibration or self.prompts)[0].ids
        return Engine.from_config(config, calibration_prompt=calibration, log=self.log)

    def _batch_stage(self, stage: Stage, result: BenchResult, bar: tqdm) -> None:
        """Every batch size of the stage's one system; records written as they finish."""
        cfg = self.config
        system = stage.systems[0]
        if stage.kind == "hf-batch":
            from specter_bench.hf_baseline import HFRunner
            from specter_bench.hf_batch import HFBatchRunner
            from specter_bench.model_loading import build_hf_model

            model = build_hf_model(cfg.model, device=cfg.device, dtype=cfg.dtype, seed=cfg.seed)
            runner = HFBatchRunner(
                HFRunner(
                    model, "hf", pad_token_id=pad_id(self.hf_config), compile=cfg.hf_compile,
                    max_cache_len=self.max_seq_len, decode_experts=cfg.hf_decode_experts,
                ),
                batch_sizes=len(self._batch_sizes()),
            )  # fmt: skip
            try:
                self._batch_sizes_of(stage, runner.generate, max(self._batch_sizes()), result,
                                     bar)  # fmt: skip
            finally:
                del model, runner
                torch._dynamo.reset()  # compiled decode steps hold the model's weights
            return
        engine, largest = self._batch_engine(stage, result)
        settings = {"speculation": engine.setup_stats.get("speculation"), "depth": engine.depth}
        slots = engine.model.memory.plan.slots_per_layer

        def decode(prompts: list[list[int]], n: int) -> BatchRun:
            run = run_engine_batch(engine, prompts, n, system=system, settings=settings)
            run.settings["slots_per_layer"] = slots
            return run

        self._batch_sizes_of(stage, decode, largest, result, bar)

    def _batch_sizes_of(
        self, stage: Stage, decode: Decode, largest: int, result: BenchResult, bar: tqdm
    ) -> None:
        cfg = self.config
        system = stage.systems[0]
        where = budget_text(stage.budget_gb)
        for at, size in enumerate(self._batch_sizes()):
            what = f"{system} at B = {size}, {where}"
            if size > largest:
                bar.update(cfg.runs)
                continue  # recorded when the engine was built
            if self._deadline.expired():
                self._skip(result, what, "--max-minutes reached", stage.budget_gb, stage.systems)
                bar.update(cfg.runs)
                continue
            prompts = self.prompts[:size]
            ids = [p.ids for p in prompts]
            records = []
            try:
                for _ in range(cfg.warmup):
                    decode(ids, min(cfg.warmup_tokens, cfg.max_new_tokens))
                for run_index in range(cfg.runs):
                    bar.set_postfix_str(f"{system} B={size} {where}")
                    run = decode(ids, cfg.max_new_tokens)
                    run.run_index = run_index
                    records.append(self._batch_record(run, prompts, stage.budget_gb))
                    bar.update(1)
            except torch.cuda.OutOfMemoryError as exc:
                reason = f"out of device memory while decoding ({str(exc).splitlines()[0]})"
                for b in self._batch_sizes()[at:]:
                    self._skip(result, f"{system} at B = {b}, {where}", reason, stage.budget_gb,
                               stage.systems)  # fmt: skip
                self._write(result, records)
                torch.cuda.empty_cache()
                return
            self._write(result, records)
            self.log(self._batch_line(records))

    @staticmethod
    def _batch_line(records: list[ExperimentRecord]) -> str:
        data = records[-1].data if records else {}
        tpot, rate = data.get("mean_tpot_ms"), data.get("throughput_tok_s")
        return (
            f"{data.get('system')} B={data.get('batch_size')}: mean TPOT "
            f"{'-' if tpot is None else f'{tpot:.2f}'} ms, "
            f"{'-' if rate is None else f'{rate:.1f}'} tokens/s"
        )

    def _batch_record(
        self, run: BatchRun, prompts: list[EncodedPrompt], budget: float | None
    ) -> ExperimentRecord:
        """One ``batch`` record: the run's figures and each sequence's greedy check against
        the prompt's reference decodes (the first system's and the first engine system's)."""
        checked = matches = engine_checked = engine_matches = 0
        references: set[str] = set()
        engine_references: set[str] = set()
        for prompt, tokens in zip(prompts, run.tokens, strict=True):
            key = f"batch:{prompt.prompt.id}"
            ref_system, ref_tokens = self.reference.setdefault(key, (run.system, tokens))
            if ref_tokens is not tokens:
                references.add(ref_system)
                checked += 1
                matches += first_mismatch(tokens, ref_tokens[: len(tokens)]) is None
            if run.system != "hf":
                engine_ref = self.engine_reference.setdefault(key, (run.system, tokens))
                if engine_ref[1] is not tokens:
                    engine_references.add(engine_ref[0])
                    engine_checked += 1
                    engine_matches += first_mismatch(tokens, engine_ref[1][: len(tokens)]) is None
        figures = batch_figures(run.stats, run.sequence_stats)
        if figures["speculation"] is None:
            figures["speculation"] = run.settings.get("speculation")
        mean_tpot = run.mean_tpot_s
        data = {
            "system": run.system,
            "batch_size": run.batch_size,
            "run_index": run.run_index,
            "mean_tpot_ms": None if mean_tpot is None else 1e3 * mean_tpot,
            "tpot_ms": [None if t is None else 1e3 * t for t in run.tpot_s],
            "throughput_tok_s": run.throughput,
            "end_to_end_tok_s": run.end_to_end_throughput,
            "prefill_ms": 1e3 * run.prefill_s,
            "decode_ms": 1e3 * run.decode_s,
            "new_tokens": [len(t) for t in run.tokens],
            "prompt_tokens": [len(p.ids) for p in prompts],
            "prompt_ids": [p.prompt.id for p in prompts],
            "prompt_source": self.config.prompts.source,
            **figures,
            "slots_per_layer": run.settings.get("slots_per_layer"),
            "peak_gpu_memory_gb": run.peak_gpu_bytes / GB if run.peak_gpu_bytes else None,
            "reference_system": ", ".join(sorted(references)) or None,
            "sequences_checked": checked,
            "sequences_matching_reference": matches,
            "engine_reference_system": ", ".join(sorted(engine_references)) or None,
            "sequences_checked_engine": engine_checked,
            "sequences_matching_engine_reference": engine_matches,
            "tokens": run.tokens,
            "settings": run.settings,
            "stats": run.stats,
        }
        return self._experiment("batch", budget, data)
