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
* **repeated runs**: each system's measured pass over the prompts runs ``--runs`` times on
  the same load, each decode recording its ``run_index``;
* **fallback**: ``specter`` with an adaptive depth under a budget decodes as ``offload`` on a
  draftless load at that budget (its records say so) where it is slower: after the
  warm-ups, each of ``offload`` (measured first at the budget) and ``specter`` decodes the
  first prompt once more (``--warmup-tokens`` tokens), and ``specter`` falls back when its
  time a token is above ``offload``'s; without ``offload`` in the run, when its warm-up
  chose K = 0. ``specter_models.Engine`` chooses the same way at load;
* a ``memory`` record per engine load: the plan, measured load and decode peaks (the
  allocator's and the driver's), host memory (peak resident set, pinned expert store), and
  the time from the process's start to the model loaded and to its first token;
* the ``ttft`` experiment (:mod:`~specter_bench.bench_ttft`): ``ttft`` records instead of
  ``tpot`` ones, for prompts of exactly ``--prompt-lengths`` tokens;
* the ``batch`` experiment (:mod:`~specter_bench.bench_batch`): ``batch`` records, each
  system decoding the first B prompts together for each ``--batch-sizes`` B.

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

from specter_bench.belady import measure_expert_transfer_s
from specter_bench.bench_batch import BatchStages
from specter_bench.bench_cpu import CpuExpertVariants
from specter_bench.bench_decodes import DecodeLoop
from specter_bench.bench_hf_stages import HFStages
from specter_bench.bench_hot_sets import HotSetStages
from specter_bench.bench_record import ExperimentRecord, TpotRecord, append_records
from specter_bench.bench_replay import ReplayedRouting, routing_label
from specter_bench.bench_routing import RoutingExperiments
from specter_bench.bench_support import (
    GB,
    BenchResult,
    Deadline,
    EncodedPrompt,
    budget_text,
)
from specter_bench.bench_tpot_records import TpotRecords
from specter_bench.bench_ttft import TtftStages
from specter_bench.engine_systems import (
    ENGINE_SYSTEMS,
    EngineSystem,
    EngineSystemRunner,
    use_staging,
)
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
from specter_bench.prompt_mix import load_prompt_mix
from specter_bench.resource_meter import (
    DeviceMemory,
    host_memory_bytes,
    process_clock_origin,
    seconds_since_start,
)
from specter_bench.run_identity import collect_identity
from specter_bench.system_run import SystemRun

__all__ = ["BenchResult", "BenchRunner", "EncodedPrompt"]


class BenchRunner(
    DecodeLoop,
    TpotRecords,
    TtftStages,
    RoutingExperiments,
    HotSetStages,
    HFStages,
    ReplayedRouting,
    CpuExpertVariants,
    BatchStages,
):
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
        # Calibration text follows the measured prompts in each source.
        measured, calibration = load_prompt_mix(config.prompts, config.calibration_prompts)

        def encoded(prompts: list) -> list[EncodedPrompt]:
            return [
                EncodedPrompt(p, encode_prompt(p.text, self.tokenizer, budget, vocab_size=vocab))
                for p in prompts
            ]

        self.prompts = encoded(measured)
        self.calibration = encoded(calibration)
        if config.routing_trace is not None:  # prompt i is the trace's sequence i
            self._replay_prompts(vocab)
        longest = max(len(p.ids) for p in self.prompts + self.calibration)
        self.ttft_prompts: list[EncodedPrompt] = []
        self.ttft_unfit: list[int] = []
        if config.experiment == "ttft":
            lengths, self.ttft_unfit = self._ttft_lengths()
            self.ttft_prompts = self._ttft_prompts(lengths)
            longest = max([longest, *lengths])
        # KV positions: the longest prompt, the new tokens and one verification of max depth.
        need = longest + config.max_new_tokens + config.max_depth + 2
        self.max_seq_len = -(-need // 64) * 64
        low, high = self._default_budgets()
        requested = config.budgets
        if requested is None and config.experiment == "batch":
            requested = (high,)  # the batched experiment runs at the high budget
        self.budgets = resolve_budgets(requested, low, high)
        if config.experiment == "batch":
            self._check_batch_prompts()
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
            prompt_source=self._prompt_source_label(),
            routing=routing_label(self.trace),
            runs=config.runs,
        )
        # Filled as the run goes.
        self.reference: dict[str, tuple[str, list[int]]] = {}
        self.engine_reference: dict[str, tuple[str, list[int]]] = {}
        self.routing: dict[str, dict[str, torch.Tensor]] = {}
        self.transfer_s: float | None = None
        self._replay_routes: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None
        self._calibration_routes: list[torch.Tensor] | None = None
        self.hot_choices: dict[float, Any] = {}  # budget -> specter_models.HotExpertChoice
        self.plain_hot_choices: dict[float, Any] = {}  # the same, for draftless loads
        self.fallbacks: dict[float, str] = {}  # budget -> why specter decodes as offload
        self.plain_trials: dict[float, float] = {}  # budget -> offload's trial, ms a token
        self.ttft_reference: dict[str, tuple[str, list[int]]] = {}
        self.first_token_s: float | None = None
        self._loads = 0  # engine loads so far in this process
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

    def _check_batch_prompts(self) -> None:
        """The batch experiment decodes B distinct prompts together: at least the largest B.

        Raises:
            ValueError: fewer prompts than the largest batch size.
        """
        largest = max(self.config.batch_sizes)
        if len(self.prompts) < largest:
            raise ValueError(
                f"the batch experiment decodes B distinct prompts together, but the prompt "
                f"source gave {len(self.prompts)}, fewer than the largest batch size {largest}: "
                f"give --num-prompts {largest} (or more) from a source that holds that many."
            )

    def _count_runs(self) -> int:
        if self.config.experiment == "batch":
            systems = sum(len(s.systems) for s in self.stages)
            return systems * len(set(self.config.batch_sizes)) * self.config.runs
        n = len(self.ttft_prompts) if self.config.experiment == "ttft" else len(self.prompts)
        total = 0
        for stage in self.stages:
            for system in stage.systems:
                if system == "hf-offload":
                    total += min(self.config.offload_prompts, n)
                else:
                    total += n * self.config.runs
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
        for length in self.ttft_unfit:
            self._skip(
                result, f"ttft at {length} prompt tokens",
                f"{length} tokens, {self.config.max_new_tokens} new ones and one verification "
                f"of depth {self.config.max_depth} exceed the model's "
                f"{self.hf_config.max_position_embeddings} positions", None,
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
                    elif stage.kind in ("batch", "hf-batch"):
                        self._batch_stage(stage, result, bar)
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

    def _stage_systems(self, stage: Stage) -> list[tuple[EngineSystem, str | None]]:
        """The systems a stage decodes, each with what its records say of speculation (None:
        the system's own): its own, and on a fallback load ``specter`` as ``offload`` where
        its warm-up chose K = 0 at this budget."""
        systems: list[tuple[EngineSystem, str | None]] = [
            (ENGINE_SYSTEMS[s], None) for s in stage.systems
        ]
        if stage.fallback and stage.budget_gb in self.fallbacks:
            offload = dataclasses.replace(ENGINE_SYSTEMS["offload"], name="specter")
            systems.append((offload, self.fallbacks[stage.budget_gb]))
        return systems

    def _stage_staging(self, systems: list[EngineSystem]) -> int:
        """The staging buffer a stage loads: as large as its systems stage, float16 only (in
        other dtypes a staging system runs unstaged, and this says so in the log)."""
        wanted = max((s.stream_staging for s in systems), default=0)
        if wanted and self.config.dtype != torch.float16:
            staged = [s.name for s in systems if s.stream_staging]
            self.log(
                f"{', '.join(staged)}: staging needs float16, this run is "
                f"{str(self.config.dtype).removeprefix('torch.')}: they run unstaged"
            )
            return 0
        return wanted

    def _fallback_check(self, runner: EngineSystemRunner, stage: Stage) -> Callable | None:
        """After a warm-up at a budget where ``specter`` (adaptive depth) may fall back: for
        ``offload``, its trial (:meth:`_trial_ms`) is kept as the plain arm; for a system that
        falls back, its own trial is compared with that, and where it is slower (or, with no
        plain arm measured, where its depth policy chose K = 0) the budget's fallback load
        decodes it as ``offload``, and the reason is returned (its decodes here stop)."""
        system = runner.system
        cfg = self.config
        budget = stage.budget_gb
        if not (cfg.fallback and cfg.depth == "auto" and budget):
            return None
        falls_back_here = any(s.fallback and s.budget_gb == budget for s in self.stages)
        if system.name == "offload" and not stage.fallback and falls_back_here:

            def keep_plain_arm() -> None:
                self.plain_trials[budget] = self._trial_ms(runner)

            return keep_plain_arm
        if not system.falls_back:
            return None
        from specter_models.engine.speculation_verdict import speculation_verdict

        def check() -> str | None:
            plain = self.plain_trials.get(budget)
            if plain is not None:
                mine = self._trial_ms(runner)
                if mine <= plain:
                    return None
                state = (
                    f"off (depth auto measured plain decoding faster: {plain:.2f} ms a token "
                    f"against {mine:.2f} with the draft on the first prompt)"
                )
                self.fallbacks[budget] = state
                return f"{state}: it decodes as offload, on offload's draftless load"
            verdict = speculation_verdict(runner.controller.depth_policy)
            if verdict is None or verdict.pays:
                return None
            self.fallbacks[budget] = verdict.state
            return (
                f"{verdict.describe()} after the warm-up: it decodes as offload, on offload's "
                "draftless load at this budget"
            )

        return check

    def _trial_ms(self, runner: EngineSystemRunner) -> float:
        """Milliseconds a token of one more decode of the first prompt (``--warmup-tokens``
        tokens, after the warm-ups): the fallback's comparison, the same decode for both
        arms."""
        cfg = self.config
        run = runner.generate(self.prompts[0].ids, min(cfg.max_new_tokens, cfg.warmup_tokens))
        tokens = max(1, run.decode_tokens or len(run.tokens))
        return 1e3 * run.decode_s / tokens

    def _capture_graphs(self, loaded: Any, systems: list[EngineSystem]) -> None:
        """Every decode step's graph, captured before any measurement: for each miss path of
        the stage's systems (a streamed verification is one graph, an acquiring one is
        pieces)."""
        started = time.perf_counter()
        captured = {}
        variants = {(s.miss_path, s.stream_staging, s.stream_waits) for s in systems}
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

    def _engine_stage(self, stage: Stage, result: BenchResult, bar: tqdm) -> None:
        cfg = self.config
        systems = self._stage_systems(stage)
        if not systems:
            return  # a fallback load that no system fell back to
        engines = [system for system, _ in systems]
        self._prepare_cpu_placement(stage)
        hot = pruned = None
        if stage.hot_experts and stage.budget_gb is not None:
            if stage.with_draft:
                choice = self._hot_choice(stage.budget_gb, result)
            else:
                choice = self._plain_hot_choice(stage.budget_gb, result)
            hot = choice.hot_experts if choice is not None and choice.per_layer else None
            pruned = choice.pruned_experts if choice is not None else None
        device_memory = DeviceMemory(cfg.device)
        before_load = device_memory.sample()
        first_load = self._loads == 0
        self._loads += 1
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
                stream_fills=max((s.stream_fills for s in engines), default=0),
                stream_staging=self._stage_staging(engines),
            ),
            hot_experts=hot,
            draft_pruned_experts=pruned or None,
        )
        load_s = time.perf_counter() - started
        loaded_at = seconds_since_start()
        after_load = device_memory.sample()
        host_after_load = host_memory_bytes()
        self.first_token_s = None
        self.log(f"loaded {loaded!r} in {load_s:.1f} s")
        self._attach_replay(loaded)  # before the graphs are captured
        if getattr(loaded, "cuda_graphs", False):
            self._capture_graphs(loaded, engines)
        runs: list[tuple[EncodedPrompt, SystemRun]] = []
        experiments: list[ExperimentRecord] = []
        try:
            if self.transfer_s is None and loaded.cache.num_experts > 0:
                self.transfer_s = measure_expert_transfer_s(loaded.cache.store, loaded.device)
                self.log(f"one expert host-to-device: {1e3 * self.transfer_s:.3f} ms")
            routing_done = not stage.routing
            for system, speculation in self._engine_system_runs(loaded, stage, result, systems):
                runner = EngineSystemRunner(
                    loaded, system, cfg.depth, max_depth=cfg.max_depth, speculation=speculation
                )
                check = self._fallback_check(runner, stage)
                if cfg.experiment == "ttft":
                    experiments += self._ttft_decodes(
                        system.name, runner.generate, bar, result, stage.budget_gb, check
                    )
                    continue
                done = self._decode_all(
                    system.name, runner.generate, cfg.max_new_tokens, self.prompts, bar, result,
                    stage.budget_gb, after_warmup=check,
                )  # fmt: skip
                runs += done
                if not routing_done:
                    # Right after the first system: every later record gets its Belady bound
                    # even if the time limit cuts the run short.
                    first = [(p, r) for p, r in runs if r.run_index == 0]
                    experiments += self._safe_routing(loaded, first, result, stage.budget_gb)
                    routing_done = True
            if not routing_done:
                experiments += self._safe_routing(loaded, runs, result, stage.budget_gb)
            if stage.depth_sweep and not self._deadline.expired():
                experiments.append(self._depth_sweep(loaded, stage, bar, result))
        finally:
            device_memory.sample()
            decoded = [r for _, r in runs] + [
                r
                for r in experiments
                if r.kind == "ttft"  # type: ignore[misc]
            ]
            use = {
                "before_load": before_load,
                "after_load": after_load,
                "total": device_memory.total,
                "peaks": [device_memory.peak],
                "host_after_load": host_after_load,
                "loaded_at": loaded_at,
                "first_load": first_load,
            }
            experiments.append(self._memory_record(loaded, stage, load_s, decoded, use))
            records = [self._tpot(run, prompt, stage.budget_gb) for prompt, run in runs]
            del loaded
            self._write(result, [*records, *experiments])

    def _memory_record(
        self, loaded: Any, stage: Stage, load_s: float, decoded: list, use: dict[str, Any]
    ) -> ExperimentRecord:
        """The ``memory`` record of one load: the plan, the allocator's and the driver's
        peaks, host memory, and the time from the process's start to the model loaded and
        to its first token (``decoded``: the load's ``SystemRun`` s and ``ttft`` records)."""
        memory = loaded.memory.as_dict()
        plan = memory["plan"]
        peaks, drivers = [0], list(use["peaks"])
        for item in decoded:
            if isinstance(item, SystemRun):
                peaks.append(item.peak_gpu_bytes or 0)
                drivers.append(item.driver_peak_bytes)
            else:
                peaks.append(int(GB * (item.data.get("peak_gpu_memory_gb") or 0)))
                driver = item.data.get("driver_peak_gpu_memory_gb")
                drivers.append(None if driver is None else int(GB * driver))
        decode_peak = max(peaks)
        known = [d for d in drivers if d is not None]
        host = host_memory_bytes()
        pinned = memory["host_store_bytes"] if memory["host_store_pinned"] else 0

        def gb(value: float | None) -> float | None:
            return None if value is None else value / GB

        return self._experiment(
            "memory",
            stage.budget_gb,
            {
                "with_draft": stage.with_draft,
                "policy": stage.policy,
                "systems": [s.name for s, _ in self._stage_systems(stage)],
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
                "driver_before_load_gb": gb(use["before_load"]),
                "driver_after_load_gb": gb(use["after_load"]),
                "driver_peak_gb": gb(max(known)) if known else None,
                "device_total_gb": gb(use["total"]),
                "host_store_gb": memory["host_store_bytes"] / GB,
                "host_store_pinned": memory["host_store_pinned"],
                "host_pinned_gb": pinned / GB,
                "host_rss_after_load_gb": gb(use["host_after_load"]["rss"]),
                "host_peak_rss_gb": gb(host["peak_rss"]),
                "load_s": load_s,
                "load_phases_s": memory["load_seconds"],
                "first_load_in_process": use["first_load"],
                "process_to_loaded_s": use["loaded_at"],
                "process_to_first_token_s": self.first_token_s,
                "process_clock": process_clock_origin(),
                "max_seq_len": self.max_seq_len,
            },
        )
