"""The benchmark's pinned hot sets: the calibration choice per budget and the hot-count
sweep."""

from __future__ import annotations

import statistics
from typing import Any

from tqdm import tqdm

from specter_bench.bench_support import (
    BenchResult,
    budget_text,
    mean_of,
)
from specter_bench.engine_systems import ENGINE_SYSTEMS, EngineSystemRunner
from specter_bench.experiments import Stage
from specter_bench.model_loading import (
    load_engine,
    release_memory,
)

__all__ = ["HotSetStages"]


class HotSetStages:
    """``BenchRunner``'s hot-set choice and hot-count sweep (a mixin: it uses the runner's
    state)."""

    def _hot_choice(self, budget: float, result: BenchResult) -> Any | None:
        """The pinned hot set at ``budget`` (``specter_models.choose_hot_experts`` on the
        calibration prompts' target routing), recorded once per budget; None when the run
        has no calibration prompts."""
        if budget in self.hot_choices:
            return self.hot_choices[budget]
        if not self.calibration:
            self.log(
                f"no hot set at {budget_text(budget)}: no calibration prompts (the prompt source "
                "has none after the measured ones, or --calibration-prompts 0)"
            )
            return None
        from specter_models import choose_hot_experts

        routes = self._calibration_routing(budget)
        depth, forced = self.config.depth, self.config.hot_experts_per_layer
        choice = choose_hot_experts(
            self.hf_config, budget, routes, window=depth + 1 if isinstance(depth, int) else 5,
            candidates=None if forced is None else [forced], dtype=self.config.dtype,
            max_seq_len=self.max_seq_len, pruned_per_layer=self.config.draft_pruned_per_layer,
        )  # fmt: skip
        self.hot_choices[budget] = choice
        self.log(
            f"hot set at {budget_text(budget)}: {choice.describe()} (replayed loads per candidate: "
            f"{choice.loads})"
        )
        note = (
            "chosen by replaying the calibration prompts' target routing (greedy decode, "
            "teacher-forced) through LRU with each candidate's slots and hot set pinned, the "
            "hot set counted on the other prompts; loads = that replay's expert loads"
        )
        self._record_hot_choice(budget, result, choice, routes, note, forced=forced is not None)
        return choice

    def _record_hot_choice(
        self, budget: float, result: BenchResult, choice: Any, routes: list, note: str,
        **extra: Any,
    ) -> None:  # fmt: skip
        """Write a hot-set choice's ``hot_experts`` record: the choice, ``extra`` fields and
        the calibration prompts and token counts it was chosen on."""
        data = {
            **choice.as_dict(),
            **extra,
            "calibration_prompts": [p.prompt.id for p in self.calibration],
            "calibration_tokens": [int(r.shape[0]) for r in routes],
        }
        self._write(result, [self._experiment("hot_experts", budget, data, note)])

    def _plain_hot_choice(self, budget: float, result: BenchResult) -> Any | None:
        """The pinned hot set of a draftless load at ``budget`` (``offload``'s:
        ``specter_models.choose_plain_hot_experts`` on the calibration prompts' routing,
        pinned only where that moves fewer experts than LRU over the same slots), recorded
        once per budget; None without calibration prompts."""
        if budget in self.plain_hot_choices:
            return self.plain_hot_choices[budget]
        if not self.calibration:
            self.log(f"no plain hot set at {budget_text(budget)}: no calibration prompts")
            return None
        from specter_models import choose_plain_hot_experts

        routes = self._calibration_routing(budget)
        choice = choose_plain_hot_experts(
            self.hf_config, budget, routes, dtype=self.config.dtype, max_seq_len=self.max_seq_len
        )
        self.plain_hot_choices[budget] = choice
        self.log(
            f"plain hot set at {budget_text(budget)}: {choice.describe()} (replayed loads per "
            f"candidate: {choice.loads})"
        )
        note = (
            "for draftless decoding (offload): the calibration routing replayed token by token "
            "through LRU over the budget's draftless slots with each candidate pinned, every "
            "candidate warm-started, the hot set counted on the other prompts"
        )
        self._record_hot_choice(
            budget, result, choice, routes, note, with_draft=False, forced=False
        )
        return choice

    def _hot_sweep_stage(self, stage: Stage, result: BenchResult, bar: tqdm) -> None:
        """specter at its high budget with each pinned hot count, one load per count."""
        from specter_models import choose_hot_experts, hottest_experts, plan_memory, routing_counts

        cfg, budget = self.config, stage.budget_gb
        assert budget is not None
        chosen = self._hot_choice(budget, result)
        if chosen is None:
            self._skip(result, "hot-count sweep", "no calibration prompts", budget)
            return
        routes = self._calibration_routing(budget)
        counts = cfg.hot_sweep_counts
        if counts is None:
            # Every candidate the budget holds, at E // 16 steps (none: all resident): the
            # chosen replay's own, unless its count was forced.
            every = chosen
            if cfg.hot_experts_per_layer is not None:
                every = choose_hot_experts(
                    self.hf_config, budget, routes, dtype=cfg.dtype,
                    max_seq_len=self.max_seq_len, pruned_per_layer=cfg.draft_pruned_per_layer,
                )  # fmt: skip
            fits = sorted(every.loads)
            spread = {fits[round(q * (len(fits) - 1))] for q in (0.25, 0.5, 0.75, 1.0) if fits}
            counts = tuple(sorted({0, chosen.per_layer, *spread}))
        experts = plan_memory(self.hf_config, dtype=cfg.dtype, max_seq_len=self.max_seq_len)
        routed = routing_counts(routes, experts.num_experts)
        prompts = self.prompts[: cfg.sweep_prompts]
        points = []
        for h in counts:
            if self._deadline.expired():
                self._skip(result, f"hot-count sweep at {h} pinned", "--max-minutes", budget)
                continue
            loaded = load_engine(
                cfg.model, budget_gb=budget, with_draft=True, policy="predictive",
                device=cfg.device, dtype=cfg.dtype, seed=cfg.seed, max_seq_len=self.max_seq_len,
                options=cfg.engine, hot_experts=hottest_experts(routed, h) if h else None,
                draft_pruned_experts=chosen.pruned_experts or None,
            )  # fmt: skip
            self._attach_replay(loaded)
            try:
                if getattr(loaded, "cuda_graphs", False):
                    if hasattr(loaded, "miss_path"):
                        loaded.miss_path = ENGINE_SYSTEMS["specter"].miss_path
                    loaded.capture_step_graphs(self.max_seq_len)
                runner = EngineSystemRunner(
                    loaded, ENGINE_SYSTEMS["specter"], cfg.depth, max_depth=cfg.max_depth
                )
                runs = self._decode_all(
                    f"specter hot={h}", runner.generate, cfg.max_new_tokens, prompts, bar,
                    result, budget, runs=1,
                )  # fmt: skip
                del runner
            finally:
                slots = loaded.memory.plan.slots_per_layer
                del loaded
                release_memory()
            if not runs:
                continue
            gens = [r.generation or {} for _, r in runs]
            caches = [r.cache or {} for _, r in runs]
            reference = [self.engine_reference.get(p.prompt.id) for p, _ in runs]
            points.append(
                {
                    "hot_experts_per_layer": h,
                    "slots_per_layer": slots,
                    "tpot_ms": statistics.median(1e3 * r.tpot_s for _, r in runs if r.tpot_s),
                    "acceptance_rate": mean_of(g.get("acceptance_rate") for g in gens),
                    "accepted_per_iteration": mean_of(
                        g.get("mean_accepted_per_iteration") for g in gens
                    ),
                    "hit_rate": mean_of(c.get("hit_rate") for c in caches),
                    "h2d_mb_per_token": mean_of(
                        c.get("bytes_moved", 0) / 1e6 / r.decode_tokens
                        for c, (_, r) in zip(caches, runs, strict=True)
                    ),
                    "replayed_loads": chosen.loads.get(h),
                    "matches_engine": [
                        None if ref is None else ref[1] == r.tokens
                        for ref, (_, r) in zip(reference, runs, strict=True)
                    ],
                    "prompts": len(runs),
                }
            )
        self._write(
            result,
            [
                self._experiment(
                    "hot_sweep",
                    budget,
                    {"points": points, "chosen": chosen.per_layer},
                    "specter (adaptive depth) with each pinned count's hot set, counted on the "
                    "calibration prompts; TPOT the median over the first prompts",
                )
            ],
        )
