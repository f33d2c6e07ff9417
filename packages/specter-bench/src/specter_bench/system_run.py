"""What one system's decode of one prompt produced, whatever the system."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["SystemRun", "first_mismatch"]


@dataclass
class SystemRun:
    """One decode of one prompt.

    Attributes:
        system: the system's name.
        tokens: generated token ids (prompt excluded).
        prefill_s: prompt processing time.
        decode_s: decode time (prefill excluded) over ``decode_tokens`` tokens.
        decode_tokens: tokens the decode time covers (all generated tokens for the engine,
            which decodes the last prompt token too; all but the first for transformers,
            whose prefill yields the first).
        draft_s, verify_s: the decode time split by phase (engine systems with speculation).
        generation: ``specter_spec.GenerationStats.as_dict(per_iteration=False)`` or None.
        cache: expert cache totals over the decode (``ExpertCache.stats()["total"]``) or None.
        prefetcher: prefetcher statistics over the decode (without the nested cache) or None.
        peak_gpu_bytes: ``torch.cuda.max_memory_allocated`` over the run, None on a CPU.
        slots_per_layer: the cache's slots per MoE layer, None without a cache.
        settings: how the system was configured (for the record's ``extra``).
        ttft_s: from the call to the first generated token on the host (the engine: its
            prefill and first decode iteration; transformers: its prefill), None where
            not timed.
        started_s: seconds since the process started when the decode was called.
        driver_peak_bytes: the device's used memory as the driver reports it
            (``torch.cuda.mem_get_info``), the most among samples at the decode's first token,
            every 16th token and its end; None on a CPU.
        run_index: which of a cell's repeated runs (``--runs``) this decode belongs to.
    """

    system: str
    tokens: list[int]
    prefill_s: float
    decode_s: float
    decode_tokens: int
    draft_s: float | None = None
    verify_s: float | None = None
    generation: dict[str, Any] | None = None
    cache: dict[str, Any] | None = None
    prefetcher: dict[str, Any] | None = None
    peak_gpu_bytes: int | None = None
    slots_per_layer: list[int] | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    ttft_s: float | None = None
    started_s: float | None = None
    driver_peak_bytes: int | None = None
    run_index: int = 0

    @property
    def tpot_s(self) -> float | None:
        """Decode seconds per token, None when no decode token was timed."""
        return self.decode_s / self.decode_tokens if self.decode_tokens else None


def first_mismatch(tokens: list[int], reference: list[int]) -> int | None:
    """Index of the first generated token that differs (or where one list ends), else None."""
    for i, (a, b) in enumerate(zip(tokens, reference, strict=False)):
        if a != b:
            return i
    if len(tokens) != len(reference):
        return min(len(tokens), len(reference))
    return None
