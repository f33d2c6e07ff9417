"""Run an experiment: every stage's systems on the same prompts, records out as JSON lines.

For each stage of :func:`~specter_bench.experiments.plan_stages` the runner builds the
model, warms each system up (unrecorded), decodes every prompt, and appends one ``tpot``
record per (system, prompt) when the stage ends, so a run stopped early keeps every
finished stage. Around the decodes:

* **cross-check**: every greedy output is compared with ``hf``'s for the same prompt (or,
  without ``hf``, the first system that decoded it); the first differing index is recorded;
* **routing** (first engine stage with a draft): the reference tokens are teacher-forced
  through the target and the draft with routing hooks, giving each prompt's routing
  ``[T, L, k]``; from it come the working set against K, draft/target agreement (per layer
  and per request, with greedy agreement and the sampled acceptance of speculative
  sampling, 1 - TV(p_target, q_draft), at T = 1 and 0.7), hit rate per policy at every
  budget, and each record's Belady bound (with the per-expert transfer time measured on
  that load);
* **depth sweep** (high budget): ``specter`` at each depth K on the first prompts;
* a ``memory`` record per engine load (plan, measured load peaks and decode peak).

``max_minutes`` is checked before every decode: once past it, nothing new starts, what
finished is written, and a ``skipped`` record lists what was not measured.
"""

from __future__ import annotations

import dataclasses
import datetime
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from specter_bench.belady import belady_bound, measure_expert_transfer_s
from specter_bench.bench_cpu import CpuExpertVariants
from specter_bench.bench_hf_stages import HFStages
from specter_bench.bench_hot_sets import HotSetStages
from specter_bench.bench_record import ExperimentRecord, TpotRecord, append_records
from specter_bench.bench_routing import RoutingExperiments
from specter_bench.bench_support import (
    GB,
    PROMPT_WARMUP_TOKENS,
    BenchResult,
    Deadline,
    EncodedPrompt,
    budget_text,
    per_token_ms,
)
from specter_bench.engine_systems import ENGINE_SYSTEMS, EngineSystemRunner, use_staging
from specter_bench.experiments import BenchConfig, Stage, plan_stages, resolve_budgets
from specter_bench.model_loading import (
    load_engine,
    load_tokenizer,
    model_config,
    model_name,
    release_memory,
    tokenizer_name,
    weights_description,
)
from specter_bench.prompt_encoding import encode_prompt
from specter_bench.prompt_sources import load_prompts
from specter_bench.run_identity import collect_identity
from specter_bench.system_run import SystemRun, first_mismatch

__all__ = ["BenchResult", "BenchRunner", "EncodedPrompt"]


class BenchRunner(RoutingExperiments, HotSetStages, HFStages, CpuExpertVariants):
    """Runs one :class:`~specter_bench.experiments.BenchConfig`.

    Args:
        config: what to run.
        progress: show a tqdm bar on stderr.
        log: where status lines go.

    Raises:
        ValueError: bad budgets for the model, prompts that do not fit its vocabulary.
    """

    def __init__(
        self,
        config: BenchConfig,
        *,
        progress: bool = True,
        log: Callable[[str], None] = lambda line: print(line, file=sys.stderr),
    ) -> None:
        self.config = config
        self.log = log
        self.progress = progress
        self.name = model_name(config.model)
        self.hf_config = model_config(config.model)
        vocab = int(self.hf_config.vocab_size)
        self.tokenizer = load_tokenizer(config.model, vocab)
        budget = config.max_prompt_tokens
        source, extra = config.prompts, config.calibration_prompts
        if source.limit is not None and extra:
            # Calibration text follows the measured prompts in the same source.
            source = dataclasses.replace(source, limit=source.limit + extra)
        encoded = [
            EncodedPrompt(p, encode_prompt(p.text, self.tokenizer, budget, vocab_size=vocab))
            for p in load_prompts(source)
        ]
        measured = config.prompts.limit if config.prompts.limit is not None else len(encoded)
        self.prompts = encoded[:measured]
        self.calibration = encoded[measured : measured + extra]
        longest = max(len(p.ids) for p in encoded)
        # KV positions: the longest prompt, the new tokens and one verification of max depth.
        need = longest + config.max_new_tokens + config.max_depth + 2
        self.max_seq_len = -(-need // 64) * 64
        low, high = self._default_budgets()
        self.budgets = resolve_budgets(config.budgets, low, high)
        self.stages = plan_stages(config, self.budgets)
        date = datetime.date.today().isoformat()
        self.path = Path(config.out_dir) / f"bench-{self.name}-{config.tag or date}.jsonl"
        self.identity = collect_identity(
            weights=weights_description(config.model, config.seed),
            device=config.device,
            dtype=config.dtype,
        )
        self.identity.update(
            command=config.command,
            experiment=config.experiment,
            tokenizer=tokenizer_name(self.tokenizer),
            max_new_tokens=config.max_new_tokens,
            prompt_source=config.prompts.source,
        )
        # Filled as the run goes.
        self.reference: dict[str, tuple[str, list[int]]] = {}
        self.engine_reference: dict[str, tuple[str, list[int]]] = {}
        self.routing: dict[str, dict[str, torch.Tensor]] = {}
        self.transfer_s: float | None = None
        self._replay_routes: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None
        self._calibration_routes: list[torch.Tensor] | None = None
        self.hot_choices: dict[float, Any] = {}  # budget -> specter_models.HotExpertChoice
        self._deadline = Deadline(config.max_minutes)

    def _default_budgets(self) -> tuple[float, float]:
        """The preset's low and high budgets; for other models (test presets, checkpoints),
        the budgets that leave a quarter and a half of each layer's experts a slot."""
        from specter_models import plan_memory
        from specter_models.presets import PRESETS

        preset = PRESETS.get(self.config.model.lower())
        if preset is not None and preset.low_budget_gb and preset.high_budget_gb:
            return preset.low_budget_gb, preset.high_budget_gb
        full = plan_memory(self.hf_config, dtype=self.config.dtype, max_seq_len=self.max_seq_len)
        E = full.num_experts
        budgets = []
        for slots in (max(1, E // 4), max(1, E // 2)):
            plan = plan_memory(
                self.hf_config,
                slots_per_layer=slots,
                dtype=self.config.dtype,
                max_seq_len=self.max_seq_len,
            )
            # Half a slot row of margin so the plan at this budget gives exactly `slots`.
            extra = plan.num_moe_layers * plan.expert_bytes // 2
            budgets.append(round((plan.expected_peak_bytes + extra) / GB, 6))
        return budgets[0], budgets[1]

    def _write(self, result: BenchResult, records: list[TpotRecord | ExperimentRecord]) -> None:
        if not records:
            return
        append_records(self.path, records)
        result.records.extend(r.as_dict() for r in records)

    def _experiment(self, kind: str, budget: float | None, data: dict, note: str | None = None):
        return ExperimentRecord(kind, self.name, budget, data, dict(self.identity), note)

    def _skip(
        self,
        result: BenchResult,
        what: str,
        reason: str,
        budget: float | None,
        systems: tuple[str, ...] = (),
    ) -> None:
        result.skipped.append(f"{what}: {reason}")
        self.log(f"skipped {what}: {reason}")
        data = {"what": what, "reason": reason, "systems": list(systems)}
        self._write(result, [self._experiment("skipped", budget, data)])

    def _count_runs(self) -> int:
        n = len(self.prompts)
        total = 0
        for stage in self.stages:
            for system in stage.systems:
                if system == "hf-offload":
                    total += min(self.config.offload_prompts, n)
                else:
                    total += n
            if stage.depth_sweep:
                total += len(self.config.sweep_depths) * min(self.config.sweep_prompts, n)
            if stage.kind == "hot-sweep":
                total += 5 * min(self.config.sweep_prompts, n)  # about: counts vary
        return total

    def run(self) -> BenchResult:
        """Run every stage; returns what was written (also appended to ``self.path``)."""
        result = BenchResult(self.path)
        self.log(
            f"specter bench: {self.name}, experiment {self.config.experiment}, "
            f"{len(self.prompts)} prompts x {self.config.max_new_tokens} tokens, budgets "
            f"{[b if b is not None else 'unlimited' for b in self.budgets]}, "
            f"{len(self.stages)} stages -> {self.path}"
        )
        bar = tqdm(
            total=self._count_runs(), desc=self.name, unit="run", file=sys.stderr,
            disable=not self.progress,
        )  # fmt: skip
        try:
            for stage in self.stages:
                systems = ", ".join(stage.systems)
                label = f"{stage.kind} stage at {budget_text(stage.budget_gb)} ({systems})"
                reserve = self.config.stage_reserve_minutes * (3 if stage.kind == "offload" else 1)
                if self._deadline.expired(reserve):
                    reason = f"--max-minutes: less than {reserve:g} min left for this stage"
                    self._skip(result, label, reason, stage.budget_gb, stage.systems)
                    continue
                try:
                    if stage.kind == "hf":
                        self._hf_stage(stage, result, bar)
                    elif stage.kind == "engine":
                        self._engine_stage(stage, result, bar)
                    elif stage.kind == "hot-sweep":
                        self._hot_sweep_stage(stage, result, bar)
                    else:
                        self._offload_stage(stage, result, bar)
                except (RuntimeError, ValueError, ImportError, MemoryError) as exc:
                    # One stage failing (out of memory, a missing library) must not lose the
                    # others: record why, free what it held, go on.
                    self.log(traceback.format_exc())
                    reason = f"{type(exc).__name__}: {exc}"
                    self._skip(result, label, reason, stage.budget_gb, stage.systems)
                finally:
                    release_memory()
            if self._replay_routes is not None:
                if self._deadline.expired():
                    self._skip(result, "policy replay", "--max-minutes reached", None)
                else:
                    self._write(result, self._policy_records(*self._replay_routes))
        finally:
            bar.close()
        return result

    def _decode_all(
        self,
        system: str,
        generate: Callable[[list[int], int], SystemRun],
        max_new_tokens: int,
        prompts: list[EncodedPrompt],
        bar: tqdm,
        result: BenchResult,
        budget: float | None,
        *,
        warmup: int | None = None,
        warm_each_prompt: bool = False,
    ) -> list[tuple[EncodedPrompt, SystemRun]]:
        """Warm up on the first prompt, then decode every prompt once, recorded.

        ``warm_each_prompt``: also run ``PROMPT_WARMUP_TOKENS`` unrecorded tokens of each
        prompt right before its measured run (compiled ``hf``: a prompt of a new length can
        recompile the decode step inside the measured decode, seen on one H200 as one prompt
        at 23.7 ms per token beside 7.5 ms).
        """
        runs = []
        warmup = self.config.warmup if warmup is None else warmup
        started = time.perf_counter()
        if warmup and not self._deadline.expired():
            for _ in range(warmup):
                # Compilation, autotuning, cache filling: unrecorded.
                generate(prompts[0].ids, min(max_new_tokens, self.config.warmup_tokens))
        warmup_s = time.perf_counter() - started
        for prompt in prompts:
            if self._deadline.expired():
                self._skip(
                    result, f"{system} at {budget_text(budget)} on {prompt.prompt.id}",
                    "--max-minutes reached", budget,
                )  # fmt: skip
                bar.update(1)
                continue
            bar.set_postfix_str(f"{system} {budget_text(budget)} {prompt.prompt.id}")
            if warm_each_prompt:
                generate(prompt.ids, min(max_new_tokens, PROMPT_WARMUP_TOKENS))
            run = generate(prompt.ids, max_new_tokens)
            run.settings["warmup_s"] = warmup_s
            runs.append((prompt, run))
            bar.update(1)
        return runs

    def _stage_staging(self, stage: Stage) -> int:
        """The staging buffer a stage loads: as large as its systems stage, float16 only (in
        other dtypes a staging system runs unstaged, and this says so in the log)."""
        wanted = max((ENGINE_SYSTEMS[s].stream_staging for s in stage.systems), default=0)
        if wanted and self.config.dtype != torch.float16:
            staged = [s for s in stage.systems if ENGINE_SYSTEMS[s].stream_staging]
            self.log(
                f"{', '.join(staged)}: staging needs float16, this run is "
                f"{str(self.config.dtype).removeprefix('torch.')}: they run unstaged"
            )
            return 0
        return wanted

    def _engine_stage(self, stage: Stage, result: BenchResult, bar: tqdm) -> None:
        cfg = self.config
        self._prepare_cpu_placement(stage)
        hot = pruned = None
        if stage.hot_experts and stage.budget_gb is not None:
            choice = self._hot_choice(stage.budget_gb, result)
            hot = choice.hot_experts if choice is not None and choice.per_layer else None
            pruned = choice.pruned_experts if choice is not None else None
        started = time.perf_counter()
        loaded = load_engine(
            cfg.model,
            budget_gb=stage.budget_gb,
            with_draft=stage.with_draft,
            policy=stage.policy,
            device=cfg.device,
            dtype=cfg.dtype,
            seed=cfg.seed,
            max_seq_len=self.max_seq_len,
            # A stream record as wide as the stage's systems fill (none fill: no fill
            # launches), and a staging buffer as large as they stage (float16 only).
            options=dataclasses.replace(
                cfg.engine,
                stream_fills=max(
                    (ENGINE_SYSTEMS[s].stream_fills for s in stage.systems), default=0
                ),
                stream_staging=self._stage_staging(stage),
            ),
            hot_experts=hot,
            draft_pruned_experts=pruned or None,
        )
        load_s = time.perf_counter() - started
        self.log(f"loaded {loaded!r} in {load_s:.1f} s")
        if getattr(loaded, "cuda_graphs", False):
            # Every decode step's graph is captured here, before any measurement: for each
            # miss path of the stage's systems (a streamed verification is one graph, an
            # acquiring one is pieces).
            started = time.perf_counter()
            captured = {}
            variants = {
                (
                    ENGINE_SYSTEMS[s].miss_path,
                    ENGINE_SYSTEMS[s].stream_staging,
                    ENGINE_SYSTEMS[s].stream_waits,
                )
                for s in stage.systems
            }
            for path, staging, waits in sorted(variants):
                if hasattr(loaded, "miss_path"):
                    loaded.miss_path = path
                name = path
                if path == "stream" and hasattr(loaded, "stream_staging"):
                    width = use_staging(loaded, staging)
                    name = f"{path}+staging{width}" if staging else path
                if path == "stream" and hasattr(loaded, "stream_waits"):
                    loaded.stream_waits = waits
                    name = f"{name}+waits" if waits else name
                captured[name] = loaded.capture_step_graphs(self.max_seq_len)
            self.log(f"captured CUDA graphs {captured} in {time.perf_counter() - started:.1f} s")
        runs: list[tuple[EncodedPrompt, SystemRun]] = []
        experiments: list[ExperimentRecord] = []
        decode_peak = 0
        try:
            if self.transfer_s is None and loaded.cache.num_experts > 0:
                self.transfer_s = measure_expert_transfer_s(loaded.cache.store, loaded.device)
                self.log(f"one expert host-to-device: {1e3 * self.transfer_s:.3f} ms")
            routing_done = not stage.routing
            for system in self._engine_system_runs(loaded, stage, result):
                runner = EngineSystemRunner(loaded, system, cfg.depth, max_depth=cfg.max_depth)
                done = self._decode_all(
                    system.name, runner.generate, cfg.max_new_tokens, self.prompts, bar, result,
                    stage.budget_gb,
                )  # fmt: skip
                runs += done
                decode_peak = max([decode_peak, *(r.peak_gpu_bytes or 0 for _, r in done)])
                if not routing_done:
                    # Right after the first system: every later record gets its Belady bound
                    # even if the time limit cuts the run short.
                    experiments += self._safe_routing(loaded, runs, result, stage.budget_gb)
                    routing_done = True
            if not routing_done:
                experiments += self._safe_routing(loaded, runs, result, stage.budget_gb)
            if stage.depth_sweep and not self._deadline.expired():
                experiments.append(self._depth_sweep(loaded, stage, bar, result))
        finally:
            memory = loaded.memory.as_dict()
            plan = memory["plan"]
            experiments.append(
                self._experiment(
                    "memory",
                    stage.budget_gb,
                    {
                        "with_draft": stage.with_draft,
                        "policy": stage.policy,
                        "hot_experts_per_layer": plan["hot_experts_per_layer"],
                        "pruned_experts_per_layer": plan.get("pruned_experts_per_layer", 0),
                        "non_expert_gb": plan["non_expert_bytes"] / GB,
                        "draft_gb": plan["draft_int4_bytes"] / GB,
                        "kv_gb": plan["kv_cache_bytes"] / GB,
                        "buffers_gb": plan["buffer_bytes"] / GB,
                        "slots_gb": plan["slot_bytes"] / GB,
                        "slots_per_layer": plan["slots_per_layer"],
                        "expected_peak_gb": plan["expected_peak_bytes"] / GB,
                        "measured_peak_gb": decode_peak / GB if decode_peak else None,
                        "load_peak_gb": memory["load"]["gpu_peak_allocated"] / GB,
                        "host_store_gb": memory["host_store_bytes"] / GB,
                        "host_store_pinned": memory["host_store_pinned"],
                        "load_s": load_s,
                        "load_phases_s": memory["load_seconds"],
                        "max_seq_len": self.max_seq_len,
                    },
                )
            )
            records = [self._tpot(run, prompt, stage.budget_gb) for prompt, run in runs]
            del loaded
            self._write(result, [*records, *experiments])

    def _tpot(
        self, run: SystemRun, prompt: EncodedPrompt, budget: float | None, note: str | None = None
    ) -> TpotRecord:
        pid = prompt.prompt.id
        # The first system to decode a prompt is its reference: hf when it runs (first).
        ref_system, ref_tokens = self.reference.setdefault(pid, (run.system, run.tokens))
        checked = ref_system != run.system
        mismatch = first_mismatch(run.tokens, ref_tokens[: len(run.tokens)]) if checked else None
        # Exactness within the engine: every engine system against the first one.
        engine_ref: tuple[str, list[int]] | None = None
        engine_mismatch = None
        if not run.system.startswith("hf"):
            engine_ref = self.engine_reference.setdefault(pid, (run.system, run.tokens))
            if engine_ref[1] is run.tokens:
                engine_ref = None  # this run is the engine reference
            else:
                engine_mismatch = first_mismatch(run.tokens, engine_ref[1][: len(run.tokens)])
        n = run.decode_tokens
        cache = run.cache or {}
        gen = run.generation or {}
        tpot_ms = 1e3 * run.tpot_s if run.tpot_s is not None else None
        speculated = run.draft_s is not None
        bound_ms = ratio = None
        bound: dict[str, Any] | None = None
        routes = self.routing.get(pid)
        if (
            routes is not None
            and run.slots_per_layer is not None
            and self.transfer_s
            and routes["target"].shape[0] == len(run.tokens)
        ):
            b = belady_bound(routes["target"], run.slots_per_layer, self.transfer_s)
            bound = b.as_dict()
            bound_ms = b.tpot_ms
            ratio = tpot_ms / bound_ms if tpot_ms is not None and bound_ms > 0 else None
        extra: dict[str, Any] = {"settings": run.settings, "tokens": list(run.tokens)}
        if run.generation is not None:
            extra["generation"] = run.generation
        if run.cache is not None:
            extra["cache"] = run.cache
        if run.prefetcher is not None:
            extra["prefetcher"] = run.prefetcher
        if bound is not None:
            extra["belady"] = bound
        return TpotRecord(
            system=run.system,
            model=self.name,
            budget_gb=budget,
            prompt_source=prompt.prompt.source,
            prompt_id=pid,
            prompt_tokens=len(prompt.ids),
            new_tokens=len(run.tokens),
            tpot_ms=tpot_ms,
            tokens_per_s=1e3 / tpot_ms if tpot_ms else None,
            prefill_ms=1e3 * run.prefill_s,
            decode_ms=1e3 * run.decode_s,
            draft_ms_per_token=per_token_ms(run.draft_s, n),
            verify_ms_per_token=per_token_ms(run.verify_s, n),
            accepted_per_iteration=gen.get("mean_accepted_per_iteration") if speculated else None,
            acceptance_rate=gen.get("acceptance_rate"),
            depth=gen.get("mean_depth"),
            hit_rate=cache.get("hit_rate"),
            prefetch_precision=cache.get("prefetch_precision"),
            prefetch_recall=cache.get("prefetch_recall"),
            h2d_bytes_per_token=cache["bytes_moved"] / n if "bytes_moved" in cache and n else None,
            stall_ms_per_token=per_token_ms(cache.get("stall_seconds"), n),
            peak_gpu_memory_gb=run.peak_gpu_bytes / GB if run.peak_gpu_bytes else None,
            slots_per_layer=run.slots_per_layer,
            belady_tpot_ms=bound_ms,
            tpot_over_belady=ratio,
            reference_system=ref_system if checked else None,
            matches_reference=mismatch is None if checked else None,
            first_mismatch=mismatch,
            engine_reference_system=engine_ref[0] if engine_ref else None,
            matches_engine_reference=engine_mismatch is None if engine_ref else None,
            engine_first_mismatch=engine_mismatch,
            note=note,
            identity=dict(self.identity),
            extra=extra,
        )  # fmt: skip
