"""llama.cpp's batch-1 decode measured at each GPU memory budget, as Specter's records.

For every budget, ``--n-cpu-moe`` is fixed (given, or ``auto``: sized by
:mod:`~specter_bench.llama_cpp.cpu_moe` from the GGUF's own tensor sizes) and one
``llama-bench`` process measures prefill and decode; with a draft GGUF,
``llama-speculative-simple`` then decodes each prompt greedily, repetition by repetition.
The driver's view of GPU memory is sampled throughout. Records are appended, as they come,
to ``OUT/bench-{model}-{tag}.jsonl`` (the file name ``specter bench`` uses), so
``specter report`` shows them beside Specter's.
"""

from __future__ import annotations

import dataclasses
import datetime
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specter_bench.bench_record import append_records, budget_label
from specter_bench.llama_cpp.cpu_moe import CpuMoePlan, estimate_at, gpu_footprint, plan_cpu_moe
from specter_bench.llama_cpp.driver_memory import DriverMemorySampler, gpu_name_from_driver
from specter_bench.llama_cpp.files import read_origin, tokenizer_copy
from specter_bench.llama_cpp.gguf_file import GgufFile, read_gguf
from specter_bench.llama_cpp.invocations import (
    BenchSettings,
    LlamaCppTree,
    SpeculativeSettings,
    bench_argv,
    run_logged,
    speculative_argv,
)
from specter_bench.llama_cpp.results import (
    bench_records,
    parse_bench_json,
    parse_speculative_output,
    speculative_record,
    system_name,
)
from specter_bench.prompt_sources import PromptSourceConfig

__all__ = ["MeasureConfig", "measure"]


@dataclass(frozen=True)
class MeasureConfig:
    """What ``specter llama-cpp bench`` measures.

    Attributes:
        gguf: the target GGUF.
        budgets: GPU memory budgets in GB (None: unlimited, every expert on the GPU).
        n_cpu_moe: ``"auto"`` (sized per budget) or a fixed block count for every budget.
        prompt_tokens: llama-bench's prompt ``P`` (the decode runs at depth ``P``).
        new_tokens: tokens decoded.
        repetitions: timed repetitions (``run_index`` 0..R-1).
        draft: a draft GGUF of the same model: also measure speculative decoding.
        draft_max: tokens drafted per step.
        prompts: the speculative runs' prompts.
        max_prompt_tokens: cut longer prompts to this many tokens (with the GGUF's kept
            tokenizer, when it has one).
        threads: CPU threads (None: llama.cpp's default).
        flash_attn: ``-fa``.
        model_label: the records' ``model`` (None: the preset the GGUF came from).
        out_dir: where the records go.
        tag: the file name's tag (None: ``llama-cpp-{date}``).
        command: the command line recorded in the identity.
        skip_plain: measure only the speculative runs.
        log_dir: where each run's whole output is kept.
    """

    gguf: Path
    budgets: tuple[float | None, ...] = (None,)
    n_cpu_moe: int | str = "auto"
    prompt_tokens: int = 128
    new_tokens: int = 128
    repetitions: int = 3
    draft: Path | None = None
    draft_max: int = 4
    prompts: PromptSourceConfig = field(default_factory=lambda: PromptSourceConfig(limit=3))
    max_prompt_tokens: int = 512
    threads: int | None = None
    flash_attn: str = "auto"
    model_label: str | None = None
    out_dir: Path = Path("benchmarks/results")
    tag: str | None = None
    command: str = ""
    skip_plain: bool = False
    log_dir: Path = Path(".llama.cpp/logs")


def measure(
    tree: LlamaCppTree, config: MeasureConfig, say: Callable[[str], None] = print
) -> list[dict[str, Any]]:
    """Measure ``config``'s budgets; returns the records written.

    Raises:
        FileNotFoundError: a missing GGUF.
        ValueError: a file that is no MoE GGUF, or bad counts.
        BudgetTooSmallError: an ``auto`` budget that cannot hold the non-expert state.
        LlamaCppError: a binary missing or failing.
    """
    target = read_gguf(config.gguf)
    draft = read_gguf(config.draft) if config.draft is not None else None
    origin = read_origin(config.gguf)
    model = config.model_label or (origin.get("checkpoint") or {}).get("preset")
    model = model or config.gguf.name.removesuffix(".gguf")
    weights = origin.get("weights") or target.file_type
    tag = config.tag or f"llama-cpp-{datetime.date.today().isoformat()}"
    path = config.out_dir / f"bench-{model}-{tag}.jsonl"
    logs = config.log_dir
    identity = _identity(config, origin, weights)
    written: list[dict[str, Any]] = []
    for budget in config.budgets:
        settings = BenchSettings(
            prompt_tokens=config.prompt_tokens,
            new_tokens=config.new_tokens,
            repetitions=config.repetitions,
            threads=config.threads,
            flash_attn=config.flash_attn,
        )
        if not config.skip_plain:
            n, plan = _n_cpu_moe(config.n_cpu_moe, target, budget, settings.n_ctx, None)
            settings = dataclasses.replace(settings, n_cpu_moe=n)
            system = system_name(weights, n)
            say(f"{system} at {budget_label(budget)}: {_plan_line(n, plan)}")
            argv = bench_argv(tree, config.gguf, settings)
            log = logs / f"{model}-{system}-{_budget_slug(budget)}.log"
            with DriverMemorySampler() as memory:
                output, seconds = run_logged(argv, log, env=tree.env(), stdout_apart=True)
            tests = parse_bench_json(output)
            identity["llama_cpp_commit"] = tests[0].get("build_commit") if tests else None
            records = bench_records(
                tests,
                settings,
                system=system,
                model=model,
                budget_gb=budget,
                identity=identity,
                driver_peak_gb=memory.peak_gb,
                extra=_extra(config.gguf, plan, memory, seconds),
            )
            append_records(path, records)
            written += records
            say(_summary(system, budget, records, memory.peak_gb, seconds))
        if draft is not None:
            written += _speculative(tree, config, target, draft, budget, model, weights, path, say)
    say(f"{len(written)} records -> {path}")
    return written


def _speculative(
    tree: LlamaCppTree,
    config: MeasureConfig,
    target: GgufFile,
    draft: GgufFile,
    budget: float | None,
    model: str,
    weights: str,
    path: Path,
    say: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    from specter_bench.prompt_sources import load_prompts

    assert config.draft is not None
    draft_weights = read_origin(config.draft).get("weights") or draft.file_type
    cut = _prompt_cutter(config)
    prompts = [(p, cut(p.text)) for p in load_prompts(config.prompts)]
    longest = max(tokens for _, (_, tokens) in prompts)
    n_ctx = -(-(longest + config.new_tokens + 2 * config.draft_max + 16) // 256) * 256
    n, plan = _n_cpu_moe(config.n_cpu_moe, target, budget, n_ctx, draft)
    system = system_name(weights, n, draft_weights)
    say(f"{system} at {budget_label(budget)}: {_plan_line(n, plan)}")
    settings = SpeculativeSettings(
        new_tokens=config.new_tokens,
        draft_max=config.draft_max,
        n_ctx=n_ctx,
        n_cpu_moe=n,
        threads=config.threads,
        flash_attn=config.flash_attn,
    )
    identity = _identity(config, read_origin(config.gguf), weights)
    records = []
    with tempfile.TemporaryDirectory() as scratch:
        for run_index in range(config.repetitions):
            for prompt, (text, _) in prompts:
                prompt_file = Path(scratch) / "prompt.txt"
                prompt_file.write_text(text, encoding="utf-8")
                argv = speculative_argv(tree, config.gguf, config.draft, prompt_file, settings)
                log = config.log_dir / f"{model}-{system}-{_slug(prompt.id)}.log"
                with DriverMemorySampler() as memory:
                    output, seconds = run_logged(argv, log, env=tree.env(), echo=False)
                result = parse_speculative_output(output)
                record = speculative_record(
                    result,
                    system=system,
                    model=model,
                    budget_gb=budget,
                    prompt_source=prompt.source,
                    prompt_id=prompt.id,
                    run_index=run_index,
                    identity=identity,
                    driver_peak_gb=memory.peak_gb,
                    extra=_extra(config.gguf, plan, memory, seconds)
                    | {"draft_gguf": str(config.draft), "draft_max": config.draft_max},
                )
                append_records(path, [record])
                records.append(record)
                say(
                    f"{system} {prompt.id} run {run_index}: TPOT {record['tpot_ms']:.2f} ms, "
                    f"acceptance {record['acceptance_rate'] or 0:.2f}, {seconds:.0f} s"
                )
    return records


def _n_cpu_moe(
    requested: int | str,
    target: GgufFile,
    budget: float | None,
    n_ctx: int,
    draft: GgufFile | None,
) -> tuple[int, CpuMoePlan | None]:
    """The block count for a budget, and the estimate behind it."""
    footprint = gpu_footprint(target, n_ctx=n_ctx)
    draft_footprint = gpu_footprint(draft, n_ctx=n_ctx) if draft is not None else None
    if requested == "auto":
        plan = plan_cpu_moe(footprint, budget, draft=draft_footprint)
        return plan.n_cpu_moe, plan
    n = int(requested)  # the estimate at a given count goes in the record, unchecked
    return n, estimate_at(footprint, n, budget, draft=draft_footprint)


def _prompt_cutter(config: MeasureConfig) -> Callable[[str], tuple[str, int]]:
    """``text -> (text cut to max_prompt_tokens, its token count)`` with the GGUF's kept
    tokenizer; without one, the text whole and its UTF-8 bytes plus BOS (an upper bound)."""
    folder = tokenizer_copy(config.gguf)
    if folder is None:
        return lambda text: (text, len(text.encode("utf-8")) + 1)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)

    def cut(text: str) -> tuple[str, int]:
        ids = tokenizer.encode(text)
        if len(ids) <= config.max_prompt_tokens:
            return text, len(ids)
        kept = ids[: config.max_prompt_tokens]
        return tokenizer.decode(kept, skip_special_tokens=True), len(kept)

    return cut


def _identity(config: MeasureConfig, origin: dict[str, Any], weights: str) -> dict[str, Any]:
    from specter_bench.run_identity import collect_identity

    checkpoint = origin.get("checkpoint") or {}
    described = (
        f"random (seed {checkpoint['seed']}), preset {checkpoint['preset']} written on "
        f"{checkpoint.get('device')}, GGUF {weights}"
        if "seed" in checkpoint
        else f"GGUF {config.gguf.resolve()} ({weights})"
    )
    identity = collect_identity(weights=described, device="cpu", dtype=weights)
    identity.update(
        device="cuda",
        gpu=gpu_name_from_driver(),
        command=config.command,
        tokenizer=(origin.get("tokenizer") or {}).get("sha256"),
        max_new_tokens=config.new_tokens,
        prompt_source="llama-bench random ids; speculative: " + config.prompts.source,
    )
    return identity


def _extra(
    gguf: Path, plan: CpuMoePlan | None, memory: DriverMemorySampler, seconds: float
) -> dict[str, Any]:
    return {
        "gguf": str(gguf),
        "cpu_moe_plan": None if plan is None else plan.__dict__,
        "driver_baseline_gpu_memory_gb": memory.baseline_gb,
        "process_seconds": round(seconds, 1),
    }


def _plan_line(n: int, plan: CpuMoePlan | None) -> str:
    return plan.describe() if plan is not None else f"--n-cpu-moe {n}"


def _summary(
    system: str, budget: float | None, records: list[dict], peak: float | None, seconds: float
) -> str:
    tpots = [r["tpot_ms"] for r in records]
    peak_text = "-" if peak is None else f"{peak:.2f} GB"
    return (
        f"{system} at {budget_label(budget)}: TPOT {statistics.median(tpots):.2f} ms "
        f"({min(tpots):.2f}-{max(tpots):.2f} over {len(tpots)} runs), driver peak "
        f"{peak_text}, {seconds:.0f} s"
    )


def _budget_slug(budget: float | None) -> str:
    return "unlimited" if budget is None else f"{budget:g}gb"


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)
