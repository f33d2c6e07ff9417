"""Synthetic benchmark records for table and plot tests (random values, known means)."""

import random

from specter_bench.bench_record import ExperimentRecord, TpotRecord

SYSTEMS = ("hf", "lru", "spec-lru", "specter")
BUDGETS = (16.0, 24.0, None)


def tpot_records(seed: int, models=("deepseek-v2-lite", "qwen1.5-moe"), prompts: int = 3):
    """``tpot`` record dicts for every model x budget x system x prompt (hf: unlimited only)."""
    rng = random.Random(seed)
    out = []
    for model in models:
        for budget in BUDGETS:
            for system in SYSTEMS:
                if system == "hf" and budget is not None:
                    continue
                for p in range(prompts):
                    spec = system in ("spec-lru", "specter")
                    tpot = rng.uniform(2.0, 80.0)
                    out.append(
                        TpotRecord(
                            system=system,
                            model=model,
                            budget_gb=budget,
                            prompt_source="humaneval",
                            prompt_id=f"HumanEval/{p}",
                            prompt_tokens=rng.randint(20, 200),
                            new_tokens=16,
                            tpot_ms=tpot,
                            tokens_per_s=1e3 / tpot,
                            prefill_ms=rng.uniform(5, 50),
                            decode_ms=16 * tpot,
                            draft_ms_per_token=rng.uniform(0, 5) if spec else None,
                            verify_ms_per_token=rng.uniform(1, 50) if spec else None,
                            acceptance_rate=rng.uniform(0.5, 1.0) if spec else None,
                            accepted_per_iteration=rng.uniform(1, 8) if spec else None,
                            depth=8.0 if spec else 0.0,
                            hit_rate=None if system == "hf" else rng.uniform(0.2, 1.0),
                            h2d_bytes_per_token=None if system == "hf" else rng.uniform(1e6, 1e8),
                            peak_gpu_memory_gb=rng.uniform(5, 30),
                            belady_tpot_ms=None if system == "hf" else rng.uniform(1, 10),
                            tpot_over_belady=None if system == "hf" else rng.uniform(1, 20),
                            reference_system=None if system == "hf" else "hf",
                            matches_reference=None if system == "hf" else rng.random() > 0.3,
                            engine_reference_system=None if system == "hf" else "lru",
                            matches_engine_reference=(
                                None if system in ("hf", "lru") else rng.random() > 0.3
                            ),
                        ).as_dict()
                    )
    return out


def experiment_records(seed: int):
    """working_set, policy_hit_rate and depth_sweep records for two models."""
    rng = random.Random(seed)
    out = []
    for model in ("deepseek-v2-lite", "phi-3.5-moe"):
        means = sorted(rng.uniform(2, 60) for _ in range(6))
        curve = [
            {"depth": d, "mean": m, "p10": m - 1, "p90": m + 1, "minimum": 1, "maximum": 64}
            for d, m in zip((1, 2, 4, 8, 16, 32), means, strict=True)
        ]
        out.append(ExperimentRecord("working_set", model, None, {"curve": curve}).as_dict())
        for budget in (16.0, 24.0):
            for window in (1, 9):
                policies = {
                    p: {"hit_rate": rng.uniform(0, 1), "loads": rng.randint(1, 99)}
                    for p in ("lru", "lfu", "predictive", "belady")
                }
                data = {"window": window, "slots_per_layer": 8, "policies": policies}
                out.append(ExperimentRecord("policy_hit_rate", model, budget, data).as_dict())
            points = [
                {"depth": d, "tpot_ms": rng.uniform(5, 50), "acceptance_rate": rng.random()}
                for d in (0, 2, 4, 8, 16)
            ]
            best = min(points, key=lambda p: p["tpot_ms"])["depth"]
            data = {"points": points, "best_depth": best}
            out.append(ExperimentRecord("depth_sweep", model, budget, data).as_dict())
    return out
