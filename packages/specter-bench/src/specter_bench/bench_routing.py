"""The benchmark's routing experiments: working set, draft/target agreement, sampled
acceptance, policy replay against the Belady bound, and the depth sweep."""

from __future__ import annotations

import statistics
import traceback
from typing import Any

import torch
from tqdm import tqdm

from specter_bench.belady import policy_hit_rates
from specter_bench.bench_record import ExperimentRecord
from specter_bench.bench_support import (
    ACCEPTANCE_TEMPERATURES,
    BenchResult,
    EncodedPrompt,
    budget_text,
    mean_of,
)
from specter_bench.engine_systems import ENGINE_SYSTEMS, EngineSystemRunner
from specter_bench.experiments import Stage
from specter_bench.model_loading import (
    load_engine,
    release_memory,
)
from specter_bench.routing_analysis import routing_agreement, working_set_curve
from specter_bench.speculative_acceptance import acceptance_key, sampled_acceptance
from specter_bench.system_run import SystemRun
from specter_models.routing_recorder import RoutingRecorder, teacher_forced_pass

__all__ = ["RoutingExperiments"]


class RoutingExperiments:
    """``BenchRunner``'s routing experiments (a mixin: it uses the runner's state)."""

    def _calibration_routing(self, budget: float) -> list[torch.Tensor]:
        """``[T, L, k]`` target routing of each calibration prompt's greedy continuation
        (the same at every budget: greedy decoding is exact), from a target-only load."""
        if self._calibration_routes is not None:
            return self._calibration_routes
        if self.trace is not None:  # the trace's routing of the calibration sequences
            self._calibration_routes = self._replayed_calibration_routing()
            return self._calibration_routes
        cfg = self.config
        loaded = load_engine(
            cfg.model, budget_gb=budget, with_draft=False, policy="lru", device=cfg.device,
            dtype=cfg.dtype, seed=cfg.seed, max_seq_len=self.max_seq_len, options=cfg.engine,
        )  # fmt: skip
        recorder = RoutingRecorder(loaded.model)
        routes = []
        try:
            for prompt in self.calibration:
                decode = EngineSystemRunner(loaded, ENGINE_SYSTEMS["lru"], 0).generate
                tokens = decode(prompt.ids, cfg.max_new_tokens).tokens
                sequence = prompt.ids + tokens[:-1]
                start = len(prompt.ids) - 1
                forced = teacher_forced_pass(recorder, loaded.target, sequence, start, loaded.reset)
                routes.append(forced.routing)
                del decode, forced
        finally:
            recorder.remove()
            del loaded, recorder
            release_memory()
        self._calibration_routes = routes
        return routes

    def _safe_routing(
        self,
        loaded: Any,
        runs: list[tuple[EncodedPrompt, SystemRun]],
        result: BenchResult,
        budget: float | None,
    ) -> list[ExperimentRecord]:
        """The routing experiments; a failure (memory, a model quirk) is recorded, not fatal."""
        if self._deadline.expired():
            self._skip(result, "routing experiments", "--max-minutes reached", budget)
            return []
        try:
            return self._routing_experiments(loaded, runs)
        except (RuntimeError, ValueError) as exc:
            self.log(traceback.format_exc())
            self._skip(result, "routing experiments", f"{type(exc).__name__}: {exc}", budget)
            return []

    def _reference_tokens(
        self, loaded: Any, runs: list[tuple[EncodedPrompt, SystemRun]], prompt: EncodedPrompt
    ) -> list[int]:
        """The tokens to teacher-force: hf's, else this stage's first decode, else a new one."""
        if prompt.prompt.id in self.reference:
            return self.reference[prompt.prompt.id][1]
        for p, run in runs:
            if p is prompt:
                return run.tokens
        runner = EngineSystemRunner(loaded, ENGINE_SYSTEMS["lru"], 0)
        return runner.generate(prompt.ids, self.config.max_new_tokens).tokens

    def _routing_experiments(
        self, loaded: Any, runs: list[tuple[EncodedPrompt, SystemRun]]
    ) -> list[ExperimentRecord]:
        recorder = RoutingRecorder(loaded.model)
        target_routes, draft_routes, greedy = [], [], []
        per_request = []
        sampled: dict[float, list[float]] = {t: [] for t in ACCEPTANCE_TEMPERATURES}
        try:
            for prompt in self.prompts:
                if self._deadline.expired():
                    break
                tokens = self._reference_tokens(loaded, runs, prompt)
                traced = self._select_replay(loaded, prompt)  # None without a replay
                sequence = prompt.ids + tokens[:-1]
                start = len(prompt.ids) - 1
                target = teacher_forced_pass(recorder, loaded.target, sequence, start, loaded.reset)
                self.routing[prompt.prompt.id] = {"target": target.routing}
                target_routes.append(target.routing)
                if loaded.draft is not None:
                    draft = teacher_forced_pass(
                        recorder, loaded.draft, sequence, start, loaded.reset
                    )
                    self.routing[prompt.prompt.id]["draft"] = draft.routing
                    draft_routes.append(draft.routing)
                    if traced is not None:  # the recorded model's; these logits mean nothing
                        greedy.append(self._replayed_agreement(traced, start, len(sequence)))
                    else:
                        # Host syncs, once per prompt: scalars only leave the device.
                        agree = draft.logits.argmax(-1) == target.logits.argmax(-1)
                        greedy.append(agree.double().mean().item())
                        for t in ACCEPTANCE_TEMPERATURES:
                            rates = sampled_acceptance(target.logits, draft.logits, t)
                            sampled[t].append(rates.double().mean().item())
                    per_request.append(routing_agreement(draft.routing, target.routing).mean)
                del target  # the [T, V] logits: one prompt's at a time
        finally:
            recorder.remove()
        if not target_routes:
            return []
        out = []
        depths = self.config.working_set_depths
        for routing, which in ((target_routes, "target"), (draft_routes, "draft")):
            if routing:
                curve = working_set_curve(routing, depths)
                data = {
                    "routing": which,
                    "prompts": len(routing),
                    "tokens_per_prompt": min(r.shape[0] for r in routing),
                    "curve": [p.as_dict() for p in curve],
                }
                out.append(self._experiment("working_set", None, data))
        if draft_routes:
            pooled = routing_agreement(torch.cat(draft_routes), torch.cat(target_routes))
            data = {
                **pooled.as_dict(),
                "per_request": per_request,
                "greedy_agreement": statistics.fmean(greedy),
                "per_request_greedy_agreement": greedy,
                "prompts": len(draft_routes),
            }
            for t, values in sampled.items():
                if not values:  # a replay: no recorded distributions
                    continue
                key = acceptance_key(t)
                data[key] = statistics.fmean(values)
                data[f"per_request_{key}"] = values
            del data["per_token"]  # per request and per layer are the published views
            note = (
                "teacher-forced on the reference tokens; sampled_acceptance = mean over positions "
                "of sum_x min(p_target, q_draft) (1 - total variation), softmax at T=1 "
                "(sampled_acceptance_t0.7: T=0.7) in float32"
            )
            if self.trace is not None:
                note = (
                    f"replayed routing trace {self.trace.name}: the routing is the trace's, "
                    "greedy_agreement its draft agreement flags; no sampled acceptance"
                )
            out.append(self._experiment("routing_agreement", None, data, note))
        # The policy replay is CPU work: it runs after every GPU stage (see run()).
        self._replay_routes = (target_routes, draft_routes)
        return out

    def _policy_records(
        self, target_routes: list[torch.Tensor], draft_routes: list[torch.Tensor]
    ) -> list[ExperimentRecord]:
        from specter_models import plan_memory

        out = []
        depth = self.config.depth if isinstance(self.config.depth, int) else 8
        E = None
        for budget in self.budgets:
            if budget is None:
                continue
            try:
                plan = plan_memory(
                    self.hf_config, budget, dtype=self.config.dtype, max_seq_len=self.max_seq_len
                )
            except ValueError as exc:  # MemoryBudgetError: this budget cannot be replayed
                self.log(f"policy replay at {budget_text(budget)} skipped: {exc}")
                continue
            E = plan.num_experts
            pinning = self.hot_choices.get(budget)
            if pinning is not None and not pinning.per_layer:
                pinning = None
            for window in (1, depth + 1):
                totals: dict[str, dict[str, float]] = {}
                for i, target in enumerate(target_routes):
                    draft = draft_routes[i] if draft_routes else None
                    rates = policy_hit_rates(
                        target, plan.slots_per_layer, draft_routing=draft, window=window,
                        num_experts=E,
                        pinned=pinning.hot_experts if pinning is not None else None,
                        pinned_slots=pinning.slots_per_layer if pinning is not None else None,
                    )  # fmt: skip
                    for name, r in rates.items():
                        acc = totals.setdefault(name, {"accesses": 0, "loads": 0})
                        acc["accesses"] += r["accesses"]  # type: ignore[operator]
                        acc["loads"] += r["loads"]  # type: ignore[operator]
                        if "hits" in r:
                            acc["hits"] = acc.get("hits", 0) + r["hits"]  # type: ignore[operator]
                policies = {}
                for name, acc in totals.items():
                    hits = acc.get("hits", acc["accesses"] - acc["loads"])
                    policies[name] = {**acc, "hit_rate": hits / acc["accesses"]}
                data = {
                    "window": window,
                    "slots_per_layer": plan.slots_per_layer,
                    "num_experts": E,
                    "prompts": len(target_routes),
                    "policies": policies,
                }
                if pinning is not None:
                    data["pinned"] = {
                        "experts_per_layer": pinning.per_layer,
                        "slots_per_layer": pinning.slots_per_layer,
                    }
                note = (
                    "replayed through specter-cache on the teacher-forced target routing; "
                    "predictive = the draft's routing of the same step prefetched; pinned = "
                    "specter's hot set at this budget (chosen on the calibration prompts) "
                    "pinned, LRU over the other slots of its plan"
                )
                out.append(self._experiment("policy_hit_rate", budget, data, note))
        return out

    def _depth_sweep(
        self, loaded: Any, stage: Stage, bar: tqdm, result: BenchResult
    ) -> ExperimentRecord:
        cfg = self.config
        prompts = self.prompts[: cfg.sweep_prompts]
        points = []
        for depth in cfg.sweep_depths:
            runner = EngineSystemRunner(loaded, ENGINE_SYSTEMS["specter"], depth)
            runner_runs = self._decode_all(
                f"specter K={depth}", runner.generate, cfg.max_new_tokens, prompts, bar, result,
                stage.budget_gb, runs=1,
            )  # fmt: skip
            if not runner_runs:
                continue
            gens = [r.generation or {} for _, r in runner_runs]
            points.append(
                {
                    "depth": depth,
                    "tpot_ms": statistics.fmean(1e3 * r.tpot_s for _, r in runner_runs if r.tpot_s),
                    "acceptance_rate": mean_of(g.get("acceptance_rate") for g in gens),
                    "accepted_per_iteration": mean_of(
                        g.get("mean_accepted_per_iteration") for g in gens
                    ),
                    "hit_rate": mean_of((r.cache or {}).get("hit_rate") for _, r in runner_runs),
                    "prompts": len(runner_runs),
                    "prompt_tpot_ms": {
                        p.prompt.id: 1e3 * r.tpot_s for p, r in runner_runs if r.tpot_s is not None
                    },
                }
            )
        best = min(points, key=lambda p: (p["tpot_ms"], p["depth"]))["depth"] if points else None
        return self._experiment(
            "depth_sweep", stage.budget_gb, {"points": points, "best_depth": best}
        )
