"""The JSON-lines records of a benchmark run (docs/benchmarking.md: what each measurement
records).

Every line is one JSON object with a ``kind``:

* ``"tpot"``: one (system, model, budget, prompt) decode, :class:`TpotRecord`: TPOT
  (decode only), tokens/s, prefill time, acceptance, depth, cache hit rate, prefetch
  precision/recall, host-to-device bytes and stall per token, peak GPU memory, the Belady
  bound and the greedy cross-check against ``hf``;
* any other kind (``"working_set"``, ``"routing_agreement"``, ``"policy_hit_rate"``,
  ``"depth_sweep"``, ``"memory"``, ``"ttft"``, ``"batch"``, ``"kernel"``, ``"skipped"``):
  :class:`ExperimentRecord`,
  with the measurement under ``data``.

Both carry the run's ``identity`` (git commit, GPU, versions, weights; see
:func:`specter_bench.run_identity.collect_identity`) and ``schema`` (this file's version).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

__all__ = [
    "EXPERIMENT_KINDS",
    "RETIRED_SYSTEMS",
    "SCHEMA_VERSION",
    "SYSTEM_NAMES",
    "ExperimentRecord",
    "TpotRecord",
    "append_records",
    "budget_label",
    "read_records",
]

SCHEMA_VERSION = 1

SYSTEM_NAMES = (
    "hf",
    "hf-default",
    "hf-offload",
    "offload",
    "lru",
    "spec-lru",
    "specter",
    "specter-acquire",
    "specter-no-hot",
    "specter-no-prefetch",
    "specter-token-verify",
    "specter-unfused-draft",
    "specter-row-cut",
    "specter-fill",
    "specter-staged",
    "specter-held",
    "specter-held0",
    "specter-layerwise",
    "specter-snapshot",
    "specter-wait",
    "specter-no-wait",
    "specter-plain",
    "specter-plain-fill",
    "specter-plain-pipe",
)
"""Systems of docs/benchmarking.md in table order: transformers (fastest configuration, default
configuration, accelerate offload), the engine's strongest plain offloader (``offload``), the
engine without speculation loading misses on demand (``lru``), speculation with LRU,
Specter, Specter acquiring its missing experts instead of streaming them, and Specter minus
its hot set / prefetch / expert-wise verification / the fused draft
kernel, with row truncation, with streamed fills, with staged streaming, with held copies
(lead 4 and 0), with layer-wise final plans (``specter-layerwise``, measured before they
became ``specter``'s default), with a final snapshot instead, with verifications that wait
for each layer's prefetches in flight (``specter-wait``, measured before it became
``specter``'s default) and streaming them instead (``specter-no-wait``); then the
engine decoding plainly on the streamed path without a draft, without and with fills, and
with fills and pipelined records (``specter-plain-pipe``, in records written before it became
``offload`` with its hot set).

Names in :data:`RETIRED_SYSTEMS` stay readable in old records but no longer run."""

RETIRED_SYSTEMS = {
    "specter-plain-pipe": "offload (the same decoding, with a pinned hot set where it pays)",
    "specter-layerwise": "specter (layer-wise final plans are its default)",
    "specter-wait": "specter (its verifications wait for prefetches in flight by default)",
}
"""Systems of older records that no longer run, and what replaced each."""

EXPERIMENT_KINDS = (
    "working_set",
    "routing_agreement",
    "policy_hit_rate",
    "depth_sweep",
    "memory",
    "hot_experts",
    "hot_sweep",
    "ttft",
    "batch",
    "cpu_placement",
    "kernel",
    "skipped",
)
"""Kinds of :class:`ExperimentRecord`."""


def budget_label(budget_gb: float | None) -> str:
    """``"24 GB"`` for a budget, ``"unlimited"`` for None."""
    if budget_gb is None:
        return "unlimited"
    return f"{budget_gb:g} GB"


@dataclass
class TpotRecord:
    """One decode of one prompt by one system at one budget.

    Times are wall-clock; TPOT is the decode time (prefill excluded) over the generated
    tokens. Fields that do not apply to a system are None (a cache hit rate for ``hf``,
    acceptance without speculation).

    Attributes:
        system: ``hf``, ``hf-default``, ``hf-offload``, ``offload``, ``lru``, ``spec-lru``,
            ``specter``,
            ``specter-acquire``, ``specter-no-hot``, ``specter-no-prefetch``,
            ``specter-token-verify``, ``specter-unfused-draft``, and the variant
            ``specter-row-cut`` (miss-aware row truncation).
        model: preset name or checkpoint path.
        budget_gb: the process's GPU memory budget in GB, None for unlimited.
        prompt_source: ``humaneval``, ``jsonl``, ...
        prompt_id: the prompt's id in its source.
        prompt_tokens: prompt length in tokens.
        new_tokens: tokens generated.
        tpot_ms: decode time per generated token.
        tokens_per_s: generated tokens per second of decode time.
        prefill_ms: time to process the prompt.
        decode_ms: total decode time.
        draft_ms_per_token, verify_ms_per_token: the decode time split by phase, per token.
        accepted_per_iteration: mean accepted proposals per draft/verify iteration.
        acceptance_rate: accepted / proposed (per-token acceptance).
        depth: mean depth K used (0 without speculation).
        hit_rate: expert cache hits / (hits + misses) in this decode.
        prefetch_precision, prefetch_recall: see ``specter_cache.cache_stats``.
        h2d_bytes_per_token: bytes moved host-to-device per generated token.
        stall_ms_per_token: time the compute waited on transfers, per generated token.
        peak_gpu_memory_gb: ``torch.cuda.max_memory_allocated`` over the decode (process
            peak since the system was built), in GB.
        driver_peak_gpu_memory_gb: the device's used memory as the driver reports it
            (``torch.cuda.mem_get_info``: the CUDA context and every allocator's reserved
            memory included), the most among samples at step boundaries, in GB; None on a
            CPU.
        ttft_ms: time to first token: from the decode's call to its first generated token on
            the host (the engine: prefill and first decode iteration; transformers: prefill).
        run_index: which of the cell's repeated runs (``--runs``) this decode belongs to (0
            in records written before repeated runs).
        slots_per_layer: the cache's slots per MoE layer (None without a cache).
        belady_tpot_ms: the Belady bound for this prompt at these slots.
        tpot_over_belady: ``tpot_ms / belady_tpot_ms``.
        reference_system: the system whose greedy tokens this one is checked against.
        matches_reference: greedy tokens equal the reference's (None: not checked).
        first_mismatch: index of the first differing generated token, None when equal.
        engine_reference_system: the first Specter-engine system (not ``hf*``) to decode
            this prompt, at any budget: exactness within the engine is checked against it
            (speculation, budgets and prefetching must not change a greedy token).
        matches_engine_reference: greedy tokens equal that system's (None: not checked).
        engine_first_mismatch: index of the first token differing from it, None when equal.
        note: anything a reader must know (fewer tokens for ``hf-offload``, ...).
        identity: the run's identity.
        extra: further per-system numbers (prefetcher statistics, memory plan, ...).
    """

    system: str
    model: str
    budget_gb: float | None
    prompt_source: str
    prompt_id: str
    prompt_tokens: int
    new_tokens: int
    tpot_ms: float | None
    tokens_per_s: float | None
    prefill_ms: float | None
    decode_ms: float | None
    draft_ms_per_token: float | None = None
    verify_ms_per_token: float | None = None
    accepted_per_iteration: float | None = None
    acceptance_rate: float | None = None
    depth: float | None = None
    hit_rate: float | None = None
    prefetch_precision: float | None = None
    prefetch_recall: float | None = None
    h2d_bytes_per_token: float | None = None
    stall_ms_per_token: float | None = None
    peak_gpu_memory_gb: float | None = None
    driver_peak_gpu_memory_gb: float | None = None
    ttft_ms: float | None = None
    run_index: int = 0
    slots_per_layer: list[int] | None = None
    belady_tpot_ms: float | None = None
    tpot_over_belady: float | None = None
    reference_system: str | None = None
    matches_reference: bool | None = None
    first_mismatch: int | None = None
    engine_reference_system: str | None = None
    matches_engine_reference: bool | None = None
    engine_first_mismatch: int | None = None
    note: str | None = None
    identity: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    kind = "tpot"

    def as_dict(self) -> dict[str, Any]:
        """The JSON object of this record (``kind`` and ``schema`` first)."""
        return {"kind": self.kind, "schema": SCHEMA_VERSION, **asdict(self)}


@dataclass
class ExperimentRecord:
    """A measurement that is not one decode: working sets, agreement, hit rates, sweeps.

    Attributes:
        kind: one of :data:`EXPERIMENT_KINDS`.
        model: preset name or checkpoint path.
        budget_gb: the budget it was measured at (None: unlimited or not applicable).
        data: the measurement (kind-specific, JSON-serialisable).
        identity: the run's identity.
        note: anything a reader must know.

    Raises:
        ValueError: an unknown kind.
    """

    kind: str
    model: str
    budget_gb: float | None
    data: dict[str, Any]
    identity: dict[str, Any] = field(default_factory=dict)
    note: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in EXPERIMENT_KINDS:
            raise ValueError(
                f"unknown experiment record kind {self.kind!r}; expected one of "
                f"{', '.join(EXPERIMENT_KINDS)} (or a TpotRecord for 'tpot')."
            )

    def as_dict(self) -> dict[str, Any]:
        """The JSON object of this record."""
        return {"schema": SCHEMA_VERSION, **asdict(self)}


Record = TpotRecord | ExperimentRecord

_REQUIRED = {
    "tpot": ("system", "model", "budget_gb", "prompt_id", "tpot_ms", "new_tokens", "identity"),
    **dict.fromkeys(EXPERIMENT_KINDS, ("model", "budget_gb", "data")),
}


def _finite(value: Any) -> Any:
    """NaN/inf are not JSON: they become None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def append_records(path: str | Path | IO[str], records: Iterable[Record | dict[str, Any]]) -> int:
    """Append records as JSON lines to a file (created with its folder) or an open stream.

    Each line is flushed as written, so a run stopped midway keeps what it finished.

    Returns:
        Lines written.

    Raises:
        TypeError: a record that is neither a record object nor a dict.
    """
    if isinstance(path, str | Path):
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8") as handle:
            return append_records(handle, records)
    count = 0
    for record in records:
        if isinstance(record, TpotRecord | ExperimentRecord):
            obj = record.as_dict()
        elif isinstance(record, dict):
            obj = record
        else:
            raise TypeError(f"cannot write a {type(record).__name__} as a record.")
        path.write(json.dumps(_finite(obj), sort_keys=False) + "\n")
        path.flush()
        count += 1
    return count


def read_records(paths: str | Path | Iterable[str | Path]) -> list[dict[str, Any]]:
    """Read and check the records of one or more JSON-lines files, in file order.

    Raises:
        FileNotFoundError: a missing file.
        ValueError: a line that is not a JSON object, has no known ``kind``, or lacks a
            field its kind requires (the message names file and line).
    """
    files = [paths] if isinstance(paths, str | Path) else list(paths)
    out: list[dict[str, Any]] = []
    for file in files:
        file = Path(file)
        if not file.is_file():
            raise FileNotFoundError(f"{file} does not exist; expected a JSON-lines results file.")
        for lineno, obj in _lines(file):
            kind = obj.get("kind")
            if kind not in _REQUIRED:
                raise ValueError(
                    f"{file} line {lineno}: unknown record kind {kind!r}; expected one of "
                    f"{', '.join(_REQUIRED)}."
                )
            missing = [k for k in _REQUIRED[kind] if k not in obj]
            if missing:
                raise ValueError(f"{file} line {lineno}: a {kind!r} record lacks {missing}.")
            out.append(obj)
    return out


def _lines(file: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with file.open(encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{file} line {lineno} is not JSON: {exc.msg}") from exc
            if not isinstance(obj, dict):
                raise ValueError(f"{file} line {lineno} is not a JSON object.")
            yield lineno, obj
