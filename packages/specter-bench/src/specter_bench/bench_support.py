"""What a benchmark run carries between its stages: encoded prompts, the result, the
deadline, and small formatting helpers."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specter_bench.hf_baseline import HFGeneration
from specter_bench.prompt_sources import Prompt
from specter_bench.system_run import SystemRun

__all__ = ["BenchResult", "Deadline", "EncodedPrompt"]

GB = 1e9
ACCEPTANCE_TEMPERATURES = (1.0, 0.7)
"""Temperatures of the sampled-acceptance figures (1.0 first: ``sampled_acceptance``)."""


PROMPT_WARMUP_TOKENS = 4
"""Unrecorded tokens a compiled ``hf`` decodes of each prompt before its measured run."""


@dataclass(frozen=True)
class EncodedPrompt:
    """A prompt and its token ids."""

    prompt: Prompt
    ids: list[int]


@dataclass
class BenchResult:
    """What a run wrote.

    Attributes:
        path: the JSON-lines file.
        records: every record written, as dicts.
        skipped: what the time limit (or an error) left unmeasured.
    """

    path: Path
    records: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


class Deadline:
    def __init__(self, minutes: float | None) -> None:
        self.end = None if minutes is None else time.monotonic() + 60.0 * minutes

    def expired(self, reserve_minutes: float = 0.0) -> bool:
        """Past the end, or less than ``reserve_minutes`` before it."""
        return self.end is not None and time.monotonic() + 60.0 * reserve_minutes >= self.end


def budget_text(budget: float | None) -> str:
    return "unlimited" if budget is None else f"{budget:g} GB"


def per_token_ms(seconds: float | None, tokens: int) -> float | None:
    """Milliseconds per token, None when not measured."""
    return 1e3 * seconds / tokens if seconds is not None and tokens else None


def mean_of(values: Any) -> float | None:
    kept = [v for v in values if v is not None]
    return statistics.fmean(kept) if kept else None


def pad_id(config: Any) -> int:
    for name in ("pad_token_id", "eos_token_id", "bos_token_id"):
        value = getattr(config, name, None)
        if isinstance(value, list):
            value = value[0] if value else None
        if isinstance(value, int):
            return value
    return 0


def hf_run(system: str, gen: HFGeneration, **settings: Any) -> SystemRun:
    """A transformers decode as a ``SystemRun``; the first generated
    token comes from the prefill, so the decode times the others."""
    return SystemRun(
        system=system,
        tokens=gen.tokens,
        prefill_s=gen.prefill_s,
        decode_s=gen.decode_s,
        decode_tokens=max(0, len(gen.tokens) - 1),
        peak_gpu_bytes=gen.peak_gpu_bytes,
        ttft_s=gen.prefill_s,
        settings={**gen.settings, **settings},
    )
