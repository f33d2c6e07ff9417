"""The benchmark's CPU expert path: the variants a run compares and the placement they use.

``--cpu-experts`` (``off``, ``auto``, ``on``, or a list of them) and ``--cpu-threads`` (a
list sweeps) make *variants*; every engine system of a stage runs once per variant, named
``system`` with the path off and ``system+cpuN`` (``system+cpu-autoN`` where ``auto`` and
``on`` both run) with it on N host threads. One placement per budget, thread count and
mode serves every system at that budget (``specter_models.cpu_calibration``: the machine's
costs measured once per thread count, the calibration prompts' routing, the budget's
draftless slots, the hot set left on the device), so ``specter`` and ``offload`` home the
same experts and their greedy tokens stay comparable. Each placement is recorded (kind
``cpu_placement``) with the host's CPU model and measured memory bandwidth.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from specter_bench.bench_support import BenchResult
from specter_bench.engine_systems import ENGINE_SYSTEMS, EngineSystem, use_staging
from specter_bench.experiments import Stage
from specter_bench.host_facts import host_facts

__all__ = ["CpuExpertVariants", "CpuVariant", "cpu_table"]


@dataclass(frozen=True)
class CpuVariant:
    """One setting of the CPU expert path a run measures.

    Attributes:
        mode: ``"off"``, ``"auto"`` or ``"on"``.
        threads: host threads (None with ``"off"``).
        suffix: what the systems' names get (empty when the run has one variant, or off).
    """

    mode: str
    threads: int | None
    suffix: str = ""


class CpuExpertVariants:
    """``BenchRunner``'s CPU expert variants (a mixin: it uses the runner's state)."""

    def _cpu_variants(self) -> list[CpuVariant]:
        from specter_models.cpu_experts import default_cpu_threads

        cfg = self.config
        threads = list(cfg.cpu_threads or (default_cpu_threads(),))
        modes = list(cfg.cpu_experts)
        on_modes = [m for m in modes if m != "off"]
        count = sum(1 if m == "off" else len(threads) for m in modes)
        variants = []
        for mode in modes:
            if mode == "off":
                variants.append(CpuVariant("off", None))
                continue
            for t in threads:
                tag = f"+cpu-{mode}{t}" if len(on_modes) > 1 else f"+cpu{t}"
                variants.append(CpuVariant(mode, t, tag if count > 1 else ""))
        return variants

    def _prepare_cpu_placement(self, stage: Stage) -> None:
        """Before a stage loads: the calibration routing its placements need (a target-only
        load of its own, which must not share the GPU with the stage's)."""
        if stage.budget_gb is None or not self.calibration:
            return
        if any(v.mode != "off" for v in self._cpu_variants()):
            self._calibration_routing(stage.budget_gb)

    def _engine_system_runs(
        self,
        loaded: Any,
        stage: Stage,
        result: BenchResult,
        systems: list[tuple[EngineSystem, str | None]],
    ) -> Iterator[tuple[EngineSystem, str | None]]:
        """The stage's ``(system, speculation)`` pairs once per CPU variant, each variant
        installed on ``loaded`` before its systems run (a variant that does not apply is
        recorded as skipped)."""
        try:
            for variant in self._cpu_variants():
                if not self._use_cpu_variant(loaded, variant, stage, result):
                    continue
                for system, speculation in systems:
                    yield (
                        dataclasses.replace(system, name=system.name + variant.suffix),
                        speculation,
                    )
        finally:
            if getattr(loaded, "cpu_experts", None) is not None:
                loaded.set_cpu_experts(None)

    def _use_cpu_variant(
        self, loaded: Any, variant: CpuVariant, stage: Stage, result: BenchResult
    ) -> bool:
        if variant.mode == "off":
            if getattr(loaded, "cpu_experts", None) is not None:
                loaded.set_cpu_experts(None)
            return True
        placement, why = self._cpu_placement(loaded, variant, stage.budget_gb, result)
        if placement is None:
            what = f"{', '.join(stage.systems)} with --cpu-experts {variant.mode}"
            self._skip(result, f"{what} on {variant.threads} threads", why, stage.budget_gb)
            return False
        loaded.set_cpu_experts(placement.homed, variant.threads)
        self.log(f"CPU experts ({variant.mode}, {variant.threads} threads): {placement.describe()}")
        if getattr(loaded, "cuda_graphs", False):
            # The target's steps are piecewise graphs now: captured here, not in a decode.
            keys = {
                (s.miss_path, s.stream_staging, s.stream_waits)
                for s in (ENGINE_SYSTEMS[name] for name in stage.systems)
            }
            for path, staging, waits in sorted(keys):
                loaded.miss_path = path
                if path == "stream":
                    use_staging(loaded, staging)
                    loaded.stream_waits = waits
                loaded.capture_step_graphs(self.max_seq_len)
        return True

    def _cpu_placement(
        self, loaded: Any, variant: CpuVariant, budget: float | None, result: BenchResult
    ) -> tuple[Any | None, str]:
        """``(placement, "")`` of ``variant`` at ``budget`` (made once, recorded), or
        ``(None, why)`` where it does not apply."""
        from specter_models.cpu_calibration import choose_placement, measure_placement_costs
        from specter_models.engine.plans import plain_plan

        cache: dict = self.__dict__.setdefault("_cpu_placements", {})
        costs: dict = self.__dict__.setdefault("_cpu_costs", {})
        key = (budget, variant.mode, variant.threads)
        if key in cache:
            return cache[key]
        why = ""
        if variant.mode == "auto":
            if loaded.device.type != "cuda":
                why = "auto: no GPU to overlap"
            elif budget is None:
                why = "auto: no budget, every expert holds a slot"
            elif not self.calibration:
                why = "auto: no calibration prompts to choose the CPU-homed experts on"
        if why:
            cache[key] = (None, why)
            return cache[key]
        if variant.threads not in costs:
            costs[variant.threads] = measure_placement_costs(loaded, variant.threads)
        routes, exclude = None, None
        if budget is not None and self.calibration:
            routes = self._calibration_routing(budget)
            hot = self._hot_choice(budget, result)
            if hot is not None and hot.per_layer:
                exclude = hot.hot_experts
        plan, _ = plain_plan(
            self.hf_config, budget, dtype=self.config.dtype, max_seq_len=self.max_seq_len
        )
        slots = plan.slots_per_layer if plan is not None else min(loaded.cache.slots_per_layer)
        placement = choose_placement(
            loaded, costs[variant.threads], routes, slots_per_layer=slots,
            at_least=1 if variant.mode == "on" else 0, exclude=exclude,
        )  # fmt: skip
        data = {
            "mode": variant.mode,
            "threads": variant.threads,
            "calibration_prompts": len(self.calibration) if routes else 0,
            **placement.as_dict(),
            "host": host_facts(),
        }
        note = (
            "each layer's least routed experts on the calibration prompts' target routing, "
            "as many as the load-time cost model chooses, computed on the host"
        )
        self._write(result, [self._experiment("cpu_placement", budget, data, note)])
        if not placement.any:
            cache[key] = (None, "auto: the cost model homes no expert at this budget")
        else:
            cache[key] = (placement, "")
        return cache[key]


def cpu_table(records: list[dict[str, Any]]) -> str | None:
    """Per system and budget: how the experts a token needed were met (resident, moved,
    streamed, computed on the host) and the host's CPU time a token; None when no record
    ran the CPU path."""
    from specter_bench.bench_record import budget_label

    rows: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for record in records:
        settings = (record.get("extra") or {}).get("settings") or {}
        if record.get("kind") != "tpot" or not settings.get("cpu_experts"):
            continue
        key = (record["system"], budget_label(record.get("budget_gb")))
        rows.setdefault(key, []).append(record)
    if not rows:
        return None
    lines = [
        "| system | budget | threads | experts a token: resident / moved / streamed / CPU "
        "| CPU busy ms a token |",
        "|---|---|---|---|---|",
    ]
    for (system, budget), recs in rows.items():
        splits, cpus = [], []
        for r in recs:
            settings = r["extra"]["settings"]
            tokens = max(r.get("new_tokens") or 1, 1)
            splits.append({k: v / tokens for k, v in settings["placement"].items()})
            cpus.append(settings["cpu_experts"])
        mean = {k: sum(s[k] for s in splits) / len(splits) for k in splits[0]}
        busy = sum(c["busy_ms_per_token"] for c in cpus) / len(cpus)
        split = " / ".join(f"{mean[k]:.1f}" for k in ("resident", "transferred", "streamed", "cpu"))
        lines.append(f"| {system} | {budget} | {cpus[0]['threads']} | {split} | {busy:.2f} |")
    return "\n".join(lines)
