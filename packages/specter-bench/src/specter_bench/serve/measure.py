"""What the server adds to a generation: the same prompts decoded by the engine directly
and through the HTTP server, alternately, on one loaded engine (``specter serve
--measure``).

The direct arm hands the engine its prompt on the engine's own thread, as ``specter
generate`` decodes, and times its chunks there. The server arm sends a streamed
``/v1/completions`` request over 127.0.0.1 from this process and times the chunks as the
client reads them, so it counts HTTP, JSON, the queue and the event loop (and this
client's own share of the process). Both arms decode greedily, so they produce the same
tokens.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specter_bench.serve.client import StreamTiming, stream_completion
from specter_bench.serve.engine import eos_ids
from specter_bench.serve.scheduler import Job
from specter_bench.serve.server import BackgroundServer
from specter_spec import SamplingConfig

__all__ = ["ArmSummary", "direct_timing", "measure_overhead"]


def direct_timing(server: BackgroundServer, prompt: str, max_new_tokens: int) -> StreamTiming:
    """Decode ``prompt`` greedily on the engine's thread and time the chunks there."""
    engine = server.scheduler.engine
    assert engine is not None

    async def run() -> StreamTiming:
        started = time.perf_counter()
        ids = list(engine.tokenizer.encode(prompt))
        job = Job(ids, max_new_tokens, SamplingConfig.greedy(), eos_ids(engine.tokenizer))
        server.scheduler.submit(job)
        first = last = None
        tokens, text = 0, ""
        stats: dict[str, Any] = {}
        while True:
            event = await job.events.get()
            if event.kind == "start":
                continue
            if event.kind == "error":
                raise event.value
            if event.kind == "end":
                stats = dict(getattr(event.value, "stats", None) or {})
                break
            if event.value.token_ids:
                tokens += len(event.value.token_ids)
                first = first if first is not None else event.at
                last = event.at
            text += event.value.text
        total = time.perf_counter() - started
        for eos in eos_ids(engine.tokenizer):  # as the server answers: EOS's text cut off
            eos_text = engine.tokenizer.decode([eos])
            text = text.split(eos_text)[0] if eos_text else text
        ttft = None if first is None else first - started
        tpot = (last - first) / (tokens - 1) if first is not None and tokens > 1 else None
        return StreamTiming(ttft, tpot, total, tokens, text, 200, stats)

    return asyncio.run(run())


@dataclass(frozen=True)
class ArmSummary:
    """Means and medians of one arm's per-prompt figures, in milliseconds."""

    ttft_ms_mean: float
    ttft_ms_median: float
    tpot_ms_mean: float
    tpot_ms_median: float
    tokens: int

    @classmethod
    def of(cls, timings: Sequence[StreamTiming]) -> ArmSummary:
        ttft = [1e3 * t.ttft_s for t in timings if t.ttft_s is not None]
        tpot = [1e3 * t.tpot_s for t in timings if t.tpot_s is not None]
        return cls(
            statistics.fmean(ttft) if ttft else float("nan"),
            statistics.median(ttft) if ttft else float("nan"),
            statistics.fmean(tpot) if tpot else float("nan"),
            statistics.median(tpot) if tpot else float("nan"),
            sum(t.tokens for t in timings),
        )


def measure_overhead(
    server: BackgroundServer,
    model: str,
    prompts: Sequence[str],
    max_new_tokens: int,
    *,
    api_key: str | None = None,
    warmup: int = 1,
    log: Any = None,
) -> dict[str, Any]:
    """Decode every prompt directly and through the server, alternately.

    Args:
        server: a ready background server.
        model: the served model's id.
        prompts: the prompts (each decoded once per arm, after ``warmup`` unrecorded
            rounds on the first prompt).
        max_new_tokens: tokens per generation.

    Returns:
        ``{"direct": ArmSummary, "server": ArmSummary, "tpot_overhead_pct",
        "ttft_overhead_ms", "tpot_overhead_pct_median", "ttft_overhead_ms_median",
        "same_text": bool, "per_prompt": [...]}`` (overheads of the means and of the
        medians; each prompt names the arm that went first).
    """
    log = log or (lambda message: None)

    def through_server(prompt: str) -> StreamTiming:
        body = {"model": model, "prompt": prompt, "max_tokens": max_new_tokens, "temperature": 0}
        timing = stream_completion(server.url, body, api_key=api_key)
        if timing.status != 200:
            raise RuntimeError(f"the server answered {timing.status} to a measured request")
        return timing

    for _ in range(warmup):
        direct_timing(server, prompts[0], max_new_tokens)
        through_server(prompts[0])
    direct, served, rows = [], [], []
    for i, prompt in enumerate(prompts):
        # The arm that goes first on a prompt pays its first-time costs (a new prompt
        # length's kernels, say): the arms take turns going first.
        if i % 2 == 0:
            d = direct_timing(server, prompt, max_new_tokens)
            s = through_server(prompt)
        else:
            s = through_server(prompt)
            d = direct_timing(server, prompt, max_new_tokens)
        direct.append(d)
        served.append(s)
        rows.append(
            {
                "prompt": i,
                "first": "direct" if i % 2 == 0 else "server",
                "tokens": d.tokens,
                "direct_ttft_ms": None if d.ttft_s is None else 1e3 * d.ttft_s,
                "server_ttft_ms": None if s.ttft_s is None else 1e3 * s.ttft_s,
                "direct_tpot_ms": None if d.tpot_s is None else 1e3 * d.tpot_s,
                "server_tpot_ms": None if s.tpot_s is None else 1e3 * s.tpot_s,
                "same_text": d.text == s.text,
            }
        )
        log(f"prompt {i + 1}/{len(prompts)}: {rows[-1]}")
    d_sum, s_sum = ArmSummary.of(direct), ArmSummary.of(served)
    return {
        "direct": d_sum,
        "server": s_sum,
        "tpot_overhead_pct": 100 * (s_sum.tpot_ms_mean / d_sum.tpot_ms_mean - 1),
        "ttft_overhead_ms": s_sum.ttft_ms_mean - d_sum.ttft_ms_mean,
        "tpot_overhead_pct_median": 100 * (s_sum.tpot_ms_median / d_sum.tpot_ms_median - 1),
        "ttft_overhead_ms_median": s_sum.ttft_ms_median - d_sum.ttft_ms_median,
        "same_text": all(row["same_text"] for row in rows),
        "per_prompt": rows,
    }
