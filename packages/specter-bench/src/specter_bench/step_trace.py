"""Where a plain decode step's time goes: each kernel in launch order, busy time, wall time.

`trace_plain_step` loads a preset without a draft (under a budget: the streamed miss path
with fills, as ``specter-plain-fill`` in the bench), captures its one-row graphs, decodes a
HumanEval prompt plainly once to warm and once timed (TPOT), then profiles two decodes under
torch.profiler: one of 1 token and one of ``1 + profiled`` tokens. Every per-token figure is
their difference over ``profiled``, so the prompt's prefill (and its expert loads) is in
neither: the wall time, the time some kernel ran (the union of kernel intervals, so
side-stream overlap counts once), the copy engine's time, the kernels and copies with the
most device time, the host's CUDA runtime calls with the most time (where it waits), and one
token's kernels in launch order, each with its median duration and the idle gap before it.
Where busy time is far below the wall time, the host bounds the step; where it is near, the
kernels do. With programmatic dependent launch a kernel's duration includes its wait for the
kernel before it. The pure parts (interval union, sequence alignment, per-token differences, the
text report) take plain tuples and are tested on the CPU; the profiling needs CUDA.
"""

from __future__ import annotations

import collections
import itertools
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from specter_bench.tables import markdown_table

__all__ = [
    "KernelStep",
    "StepTraceConfig",
    "format_step_trace",
    "kernel_sequence",
    "per_token",
    "profile_totals",
    "trace_plain_step",
    "union_ms",
]

# Kernel names are cut to this many characters in the sequence and the totals.
SEQUENCE_NAME = 48
TOTALS_NAME = 80


@dataclass(frozen=True)
class StepTraceConfig:
    """One trace.

    Attributes:
        model: preset name or checkpoint folder.
        gpu_memory_gb: expert budget in GB, or None (every expert resident, nothing streamed).
        tokens: tokens of the warm and the timed decode.
        profiled: decode tokens under the profiler.
        fills: streamed-miss fills (under a budget).
        top: kernels and runtime calls listed by time.
        pipelined: pipelined stream records, as ``specter generate`` decodes.
        device: a CUDA device.
        batch: 0 traces single-sequence steps (graphed, as above); ``B >= 1`` traces the
            steps of ``B`` sequences decoded together without a draft
            (``Engine.generate_batch`` at depth 0, the path ``specter generate
            --max-batch`` and ``specter serve --max-batch`` take), each profiled "token"
            one batched step.
    """

    model: str = "qwen1.5-moe"
    gpu_memory_gb: float | None = 14.0
    tokens: int = 64
    profiled: int = 16
    fills: int = 8
    top: int = 14
    pipelined: bool = True
    device: str = "cuda"
    batch: int = 0


@dataclass(frozen=True)
class KernelStep:
    """One kernel of a token's launch sequence: its name, median duration and idle gap
    before it (microseconds)."""

    name: str
    median_us: float
    gap_us: float


def union_ms(intervals: Iterable[tuple[float, float]]) -> float:
    """Milliseconds covered by at least one ``(start, end)`` interval in microseconds."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total / 1e3


def kernel_sequence(
    spans: Sequence[tuple[float, float, str]], calls_per_token: dict[str, float]
) -> list[KernelStep]:
    """One token's kernels in launch order.

    Tokens are cut at the first kernel launched exactly once a token (``calls_per_token``);
    of the last 5 whole tokens before the final one, those of the most common length are
    aligned by position, and each position gets its median duration and idle gap.

    Args:
        spans: every kernel as ``(start us, end us, name)``, sorted by start.
        calls_per_token: launches per token of each kernel name.

    Returns:
        The sequence, or ``[]`` when no kernel is launched once a token.
    """
    once = [n for n, c in calls_per_token.items() if abs(c - 1.0) < 1e-9]
    if not once:
        return []
    marker = once[0][:SEQUENCE_NAME]
    starts = [i for i, s in enumerate(spans) if s[2] == marker]
    window = starts[-7:-1]  # the markers of the last 5 whole tokens before the final one
    # Each token with the kernel before it first (the very first token has none: left out).
    tokens = [spans[i - 1 : j] for i, j in itertools.pairwise(window) if i > 0]
    if not tokens:
        return []
    lengths = [len(t) for t in tokens]
    common = max(set(lengths), key=lengths.count)
    tokens = [t for t in tokens if len(t) == common]  # each with the kernel before it first
    out = []
    for j in range(1, common):
        durations = sorted(t[j][1] - t[j][0] for t in tokens)
        gaps = sorted(t[j][0] - t[j - 1][1] for t in tokens)
        mid = len(tokens) // 2
        out.append(KernelStep(tokens[-1][j][2], round(durations[mid], 2), round(gaps[mid], 2)))
    return out


def profile_totals(events: Iterable[Any]) -> dict[str, Any]:
    """Totals of one profiled decode from torch.profiler events.

    Each event has ``name``, ``device_type`` (``torch.autograd.DeviceType``) and
    ``time_range`` (``start``, ``end`` in microseconds).

    Returns:
        ``spans`` (kernels but copies and memsets, sorted), ``kernel_busy_ms``,
        ``copy_busy_ms``, ``kernels`` (count), and name -> value counters ``kernel_ms``,
        ``kernel_calls``, ``copy_ms``, ``copy_calls``, ``runtime_ms``, ``runtime_calls``,
        ``host_ms`` and ``host_calls`` (host operators: their own time, ``self_cpu_time_total``,
        and calls; ``aten::_local_scalar_dense`` counts a read of a device value).
    """
    import torch

    cuda = torch.autograd.DeviceType.CUDA
    kernels, copies, spans = [], [], []
    keys = (
        "kernel_ms", "kernel_calls", "copy_ms", "copy_calls", "runtime_ms", "runtime_calls",
        "host_ms", "host_calls",
    )  # fmt: skip
    sums: dict[str, collections.Counter] = {k: collections.Counter() for k in keys}
    for ev in events:
        span = (ev.time_range.start, ev.time_range.end)
        ms = (span[1] - span[0]) / 1e3
        if ev.device_type != cuda:
            if ev.name.startswith("cuda"):  # runtime calls: where the host waits
                sums["runtime_ms"][ev.name[:60]] += ms
                sums["runtime_calls"][ev.name[:60]] += 1
            else:  # operators: where the host spends its own time
                sums["host_ms"][ev.name[:60]] += getattr(ev, "self_cpu_time_total", 0.0) / 1e3
                sums["host_calls"][ev.name[:60]] += 1
            continue
        name = ev.name[:TOTALS_NAME]
        if "memcpy" in ev.name.lower():
            copies.append(span)
            sums["copy_ms"][name] += ms
            sums["copy_calls"][name] += 1
        else:
            kernels.append(span)
            sums["kernel_ms"][name] += ms
            sums["kernel_calls"][name] += 1
            if "emset" not in ev.name:
                spans.append((*span, ev.name[:SEQUENCE_NAME]))
    return {
        "spans": sorted(spans),
        "kernel_busy_ms": union_ms(kernels),
        "copy_busy_ms": union_ms(copies),
        "kernels": len(kernels),
        **sums,
    }


def per_token(
    full: dict[str, Any], base: dict[str, Any], key: str, steps: int, top: int | None = None
) -> dict[str, float]:
    """``(full[key] - base[key]) / steps`` per name, largest first, the first ``top``."""
    diff = {n: (full[key][n] - base[key].get(n, 0)) / steps for n in full[key]}
    ranked = sorted(diff.items(), key=lambda kv: -kv[1])
    return {n: round(v, 4) for n, v in ranked[:top]}


def summarize(full: dict[str, Any], base: dict[str, Any], steps: int, top: int) -> dict:
    """Per-token figures of the decode steps alone: ``full`` (1 + ``steps`` tokens) minus
    ``base`` (1 token), each a `profile_totals` result with its ``wall_ms`` added."""
    if steps < 1:
        raise ValueError(f"profiled tokens must be >= 1, got {steps}.")
    calls = per_token(full, base, "kernel_calls", steps)
    return {
        "profiled_tokens": steps,
        "profiled_wall_ms_per_token": (full["wall_ms"] - base["wall_ms"]) / steps,
        "kernel_busy_ms_per_token": (full["kernel_busy_ms"] - base["kernel_busy_ms"]) / steps,
        "copy_busy_ms_per_token": (full["copy_busy_ms"] - base["copy_busy_ms"]) / steps,
        "kernels_per_token": (full["kernels"] - base["kernels"]) / steps,
        "top_kernels_ms_per_token": per_token(full, base, "kernel_ms", steps, top),
        "top_kernel_calls_per_token": per_token(full, base, "kernel_calls", steps, top),
        "copies_ms_per_token": per_token(full, base, "copy_ms", steps),
        "copies_per_token": per_token(full, base, "copy_calls", steps),
        "runtime_ms_per_token": per_token(full, base, "runtime_ms", steps, top),
        "runtime_calls_per_token": per_token(full, base, "runtime_calls", steps, top),
        "host_ms_per_token": per_token(full, base, "host_ms", steps, top),
        "host_calls_per_token": per_token(full, base, "host_calls", steps, top),
        "sequence": [
            [k.name, k.median_us, k.gap_us] for k in kernel_sequence(full["spans"], calls)
        ],
    }


def format_step_trace(result: dict[str, Any]) -> str:
    """The text report of a `trace_plain_step` result: a summary line, the kernels with the
    most device time, the runtime calls, and the launch sequence with its totals."""
    budget = result.get("budget_gb")
    lines = [
        f"{result['model']} at {'unlimited' if budget is None else f'{budget:g} GB'}"
        + (f", {result['batch']} sequences a step" if result.get("batch") else "")
        + ": "
        f"TPOT {result['tpot_ms']:.2f} ms; per profiled token: wall "
        f"{result['profiled_wall_ms_per_token']:.3f} ms, kernels busy "
        f"{result['kernel_busy_ms_per_token']:.3f} ms, copies busy "
        f"{result['copy_busy_ms_per_token']:.3f} ms, "
        f"{result['kernels_per_token']:.1f} kernels",
        "",
        markdown_table(
            ["kernel", "ms / token", "calls / token"],
            [
                [name, ms, result["top_kernel_calls_per_token"].get(name, "")]
                for name, ms in result["top_kernels_ms_per_token"].items()
            ],
            digits=4,
        ),
        "",
        markdown_table(
            ["runtime call", "ms / token", "calls / token"],
            [
                [name, ms, result["runtime_calls_per_token"].get(name, "")]
                for name, ms in result["runtime_ms_per_token"].items()
            ],
            digits=4,
        ),
    ]
    host = result.get("host_ms_per_token") or {}
    if host:
        calls = result.get("host_calls_per_token") or {}
        lines += [
            "",
            markdown_table(
                ["host operator", "own ms / token", "calls / token"],
                [[name, ms, calls.get(name, "")] for name, ms in host.items()],
                digits=4,
            ),
        ]
    sequence = result.get("sequence") or []
    if sequence:
        lines += [
            "",
            markdown_table(
                ["#", "kernel (launch order)", "median us", "gap before us"],
                [[i, name, us, gap] for i, (name, us, gap) in enumerate(sequence, 1)],
            ),
            f"sequence: {len(sequence)} kernels, {sum(s[1] for s in sequence):.1f} us running, "
            f"{sum(s[2] for s in sequence):.1f} us idle between them",
        ]
    else:
        lines += ["", "sequence: no kernel is launched exactly once a token; none recorded"]
    return "\n".join(lines)


def trace_plain_step(config: StepTraceConfig) -> dict[str, Any]:
    """Loads, warms, times and profiles plain decodes (module docstring); needs CUDA.

    Raises:
        ValueError: ``config.device`` is not a CUDA device, or torch sees no GPU.
    """
    import torch

    if not config.device.startswith("cuda") or not torch.cuda.is_available():
        raise ValueError(
            f"the step trace profiles CUDA kernels; device {config.device!r} "
            f"(CUDA available: {torch.cuda.is_available()}) cannot run it. Use a CUDA machine."
        )
    if config.batch:
        return _trace_batch_step(config)
    from specter_models import EngineConfig, LoadConfig, MemoryConfig, SpeculationConfig, load
    from specter_models.engine.decode_window import DecodeWindow
    from specter_spec import SpecController

    budget = config.gpu_memory_gb
    lm = load(
        EngineConfig(
            load=LoadConfig(model=config.model, device=config.device),
            memory=MemoryConfig(
                gpu_memory_gb=budget or None,
                max_seq_len=1024,
                miss_path="stream" if budget else "load",
                stream_fills=config.fills if budget else 0,
            ),
            speculation=SpeculationConfig(depth=0),
        )
    )
    prompt = _prompt(config.model, lm.model.config.vocab_size)
    if not budget:
        lm.prefetch_all()
    lm.capture_step_graphs(min_length=len(prompt), max_rows=1)
    record = lm.runtime.stream_record
    if budget and record is not None and record.deferred:
        record.pipelined = config.pipelined
    window = DecodeWindow(lm.cache, None, streamed_plain=bool(budget))

    def decode(tokens: int):
        lm.reset()
        return SpecController(None, lm.target, cache=window, depth=0).generate(prompt, tokens)

    decode(config.tokens)  # warm: compile, fill the cache
    started = time.perf_counter()
    out = decode(config.tokens)
    wall_s = time.perf_counter() - started
    torch.cuda.synchronize()

    # The prefill (and its loads) is in both runs; their difference is decode steps alone.
    base, full = _profiled(decode, 1), _profiled(decode, 1 + config.profiled)
    return {
        "model": config.model,
        "budget_gb": budget,
        "tpot_ms": 1e3 * out.stats.tpot_s,
        "decode_wall_s": wall_s,
        "slots_per_layer": lm.memory.plan.slots_per_layer,
        "pipelined_records": bool(getattr(record, "pipelined", False)),
        "hit_rate": lm.cache.stats()["total"]["hit_rate"],
        **summarize(full, base, config.profiled, config.top),
    }


def _prompt(model: str, vocab: int) -> list[int]:
    """The first HumanEval prompt's token ids for ``model``."""
    from specter_bench.model_loading import load_tokenizer
    from specter_bench.prompt_encoding import encode_prompt
    from specter_bench.prompt_sources import load_humaneval

    return encode_prompt(load_humaneval(1)[0].text, load_tokenizer(model, vocab), vocab_size=vocab)


def _profiled(decode: Any, tokens: int) -> dict[str, Any]:
    """``profile_totals`` of ``decode(tokens)`` under torch.profiler, with its wall time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        decode(tokens)
        torch.cuda.synchronize()
        wall_ms = 1e3 * (time.perf_counter() - t0)
    return {**profile_totals(prof.events()), "wall_ms": wall_ms}


def _trace_batch_step(config: StepTraceConfig) -> dict[str, Any]:
    """`trace_plain_step` for ``config.batch`` sequences decoded together without a draft:
    an engine built as the bench's batched ``offload`` (its defaults under the budget), the
    first HumanEval prompt ``B`` times, each profiled token one batched step."""
    import torch

    from specter_models import (
        BatchConfig,
        Engine,
        EngineConfig,
        LoadConfig,
        MemoryConfig,
        SpeculationConfig,
    )

    budget = config.gpu_memory_gb
    engine = Engine.from_config(
        EngineConfig(
            load=LoadConfig(model=config.model, device=config.device),
            memory=MemoryConfig(gpu_memory_gb=budget or None, max_seq_len=512),
            speculation=SpeculationConfig(depth=0, depth_memory=False),
            batch=BatchConfig(max_batch=config.batch),
        )
    )
    prompt = _prompt(config.model, engine.model.model.config.vocab_size)
    prompts = [prompt] * config.batch

    def decode(tokens: int) -> Any:
        generation = engine.generate_batch(prompts, max_new_tokens=tokens, stop_token_ids=[])
        for _ in generation:
            pass
        return generation

    decode(config.tokens)  # warm: compile, fill the cache
    started = time.perf_counter()
    generation = decode(config.tokens)
    wall_s = time.perf_counter() - started
    torch.cuda.synchronize()
    stats = generation.stats
    base, full = _profiled(decode, 1), _profiled(decode, 1 + config.profiled)
    lm = engine.model
    return {
        "model": config.model,
        "budget_gb": budget,
        "batch": config.batch,
        "tpot_ms": 1e3 * wall_s / max(1, stats.get("steps") or config.tokens),
        "decode_wall_s": wall_s,
        "slots_per_layer": lm.memory.plan.slots_per_layer,
        "hit_rate": lm.cache.stats()["total"]["hit_rate"],
        **summarize(full, base, config.profiled, config.top),
    }
