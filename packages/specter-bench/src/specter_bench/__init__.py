"""specter-bench.

The ``specter`` command line (generate, bench, profile-depth, kernel-bench, info, report;
one module each under ``specter_bench.commands``), the baselines (``hf``, ``hf-offload``,
``lru``, ``spec-lru``, ``specter`` and its ablations), the experiments, and their records,
tables and plots.

Names are imported on first use (PEP 562), so ``import specter_bench`` and the CLI's light
commands do not pay for transformers and the models until they need them.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    # prompts
    "Prompt": "prompt_sources",
    "PromptSourceConfig": "prompt_sources",
    "load_prompts": "prompt_sources",
    "load_humaneval": "prompt_sources",
    "load_jsonl_prompts": "prompt_sources",
    "load_c4": "prompt_sources",
    "load_wikitext2": "prompt_sources",
    "load_gsm8k": "prompt_sources",
    "load_gpqa": "prompt_sources",
    "ByteTokenizer": "specter_models.tokenizers",
    "encode_prompt": "prompt_encoding",
    "truncate_prompt": "prompt_encoding",
    # records
    "TpotRecord": "bench_record",
    "ExperimentRecord": "bench_record",
    "SYSTEM_NAMES": "bench_record",
    "append_records": "bench_record",
    "read_records": "bench_record",
    "collect_identity": "run_identity",
    # systems and experiments
    "ENGINE_SYSTEMS": "engine_systems",
    "EngineSystem": "engine_systems",
    "EngineSystemRunner": "engine_systems",
    "DecodeWindow": "specter_models.engine.decode_window",
    "HFRunner": "hf_baseline",
    "SystemRun": "system_run",
    "BenchConfig": "experiments",
    "EXPERIMENTS": "experiments",
    "plan_stages": "experiments",
    "BenchRunner": "bench_runner",
    "BenchResult": "bench_runner",
    # routing, bounds, kernels
    "RoutingRecorder": "specter_models.routing_recorder",
    "teacher_forced_routing": "specter_models.routing_recorder",
    "teacher_forced_pass": "specter_models.routing_recorder",
    "TeacherForcedPass": "specter_models.routing_recorder",
    "sampled_acceptance": "speculative_acceptance",
    "working_set": "routing_analysis",
    "working_set_curve": "routing_analysis",
    "routing_agreement": "routing_analysis",
    "routing_trace": "routing_analysis",
    "draft_plans": "routing_analysis",
    "belady_bound": "belady",
    "policy_hit_rates": "belady",
    "measure_expert_transfer_s": "belady",
    "run_kernel_bench": "kernel_bench",
    "KernelShape": "kernel_bench",
    # tables, plots, report, CLI
    "tpot_table": "tables",
    "targets_table": "tables",
    "evaluate_targets": "tables",
    "summarize_tpot": "tables",
    "markdown_table": "tables",
    "plot_tpot_per_system": "plots",
    "plot_working_set": "plots",
    "plot_policy_hit_rate": "plots",
    "plot_depth_sweep": "plots",
    "save_png": "plots",
    "write_report": "report",
    "main": "cli",
}

__all__ = ["__version__", *sorted(_EXPORTS)]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'specter_bench' has no attribute {name!r}")
    path = module if module.startswith("specter_models.") else f"specter_bench.{module}"
    value = getattr(importlib.import_module(path), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
