"""Whether speculation pays: the adaptive depth's verdict, and the engine's memory of it.

An adaptive depth (specter-spec ``AdaptiveDepth``) prices every depth K from the draft and
verify times and the acceptance it measured, and picks the K with the most committed tokens
a second, K = 0 (plain decoding) included. Where it picks 0 the draft does not pay for
itself at this budget, and a decode that keeps the draft loaded to decode plainly is the
worst of both: fewer FP16 slots (the INT4 draft holds their memory) and none of plain
decoding's own machinery. So where the verdict is "does not pay", the engine decodes as
plain decoding does best: no draft (its memory buys slots), streamed misses with fills and
pipelined records (the bench's ``offload``), and says so: ``speculation: off (depth auto
chose 0: ...)``.

A generation of an adaptive-depth engine under a budget keeps the verdict its policy
reached (:func:`write_verdict`), keyed by everything set before loading
(:func:`verdict_setup`); the next engine of the same setup reads it before it loads
(:func:`read_verdict`) and, where the draft did not pay, loads without it. A kept "does
not pay" is not revisited by plain decodes (they measure no draft); ``keep_draft`` or
``depth_memory=False`` ignores it, and the next speculative generation replaces it. The
files live in ``$SPECTER_CACHE_DIR/speculation`` beside the depth costs.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from specter_models.engine.depth_memory import model_and_versions, setup_file, setup_key
from specter_spec import AdaptiveDepth

__all__ = [
    "SpeculationVerdict",
    "read_verdict",
    "speculation_verdict",
    "verdict_path",
    "verdict_setup",
    "write_verdict",
]

SCHEMA = 1


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


@dataclass(frozen=True)
class SpeculationVerdict:
    """What an adaptive depth's estimates say of speculation.

    Attributes:
        pays: some depth K >= 1 commits more tokens a second than plain decoding (the
            policy's ``best_depth()`` is not 0).
        acceptance: the policy's per-proposal acceptance estimate.
        plain_tokens_per_s: estimated committed tokens a second at K = 0.
        best_depth: the speculative depth K >= 1 with the most.
        best_tokens_per_s: its estimated committed tokens a second.
    """

    pays: bool
    acceptance: float
    plain_tokens_per_s: float
    best_depth: int
    best_tokens_per_s: float

    @property
    def state(self) -> str:
        """``off (depth auto chose 0: ...)`` or ``on (depth auto: ...)``, with the figures
        behind it: the value of the statistics' and records' ``speculation``."""
        figures = (
            f"plain decoding {self.plain_tokens_per_s:.1f} tokens/s, the best draft depth "
            f"K={self.best_depth} {self.best_tokens_per_s:.1f} at acceptance "
            f"{self.acceptance:.2f}"
        )
        if self.pays:
            return f"on (depth auto: {figures})"
        return f"off (depth auto chose 0: {figures})"

    def describe(self) -> str:
        """``speculation: <state>``, one line for a log."""
        return f"speculation: {self.state}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def speculation_verdict(policy: Any) -> SpeculationVerdict | None:
    """The verdict of ``policy`` (an ``AdaptiveDepth``) at its current estimates; None for
    any other policy, or while its costs are unknown (no draft or fewer than two verified
    row counts measured)."""
    if not isinstance(policy, AdaptiveDepth):
        return None
    best = policy.best_depth()
    if best is None:
        return None
    rates = [policy.expected_rate(k) for k in range(policy.max_depth + 1)]
    if any(r is None for r in rates):
        return None
    deep = max(range(1, len(rates)), key=lambda k: (rates[k], -k))
    return SpeculationVerdict(
        pays=best != 0,
        acceptance=float(policy.acceptance),
        plain_tokens_per_s=float(rates[0]),
        best_depth=deep,
        best_tokens_per_s=float(rates[deep]),
    )


def verdict_setup(
    config: Any, *, device: str, dtype: torch.dtype, budget_gb: float | None, max_seq_len: int
) -> dict[str, Any]:
    """The :func:`~specter_models.engine.depth_memory.setup_key` a verdict belongs to: what
    an ``EngineConfig`` sets before loading (``"auto"`` budgets resolved), the device, and
    the versions whose kernels the step times depend on."""
    load, memory, kernels = config.load, config.memory, config.kernels
    return setup_key(
        **model_and_versions(load.model, device),
        weights_seed=load.weights_seed,
        draft=load.draft,
        dtype=str(dtype),
        budget_gb=budget_gb,
        slots_per_layer=memory.slots_per_layer,
        hot_experts=memory.hot_experts,
        hot_set_tokens=memory.hot_set_tokens,
        draft_pruned=str(memory.draft_pruned),
        miss_path=memory.miss_path,
        stream_fills=memory.stream_fills,
        stream_staging=memory.stream_staging,
        max_seq_len=max_seq_len,
        # The KV slots of a batch take memory a budget's expert slots would have had.
        **({"max_batch": config.batch.max_batch} if config.batch.max_batch > 1 else {}),
        batch_invariant=kernels.batch_invariant,
        cuda_graphs=kernels.cuda_graphs,
        piecewise_graphs=kernels.piecewise_graphs,
        shared_overlap=kernels.shared_overlap,
        max_depth=config.speculation.max_depth,
    )


def verdict_path(setup: dict[str, Any]) -> Path:
    """The file of ``setup`` under ``$SPECTER_CACHE_DIR/speculation``."""
    return setup_file(setup, "speculation")


def read_verdict(
    setup: dict[str, Any], log: Callable[[str], None] = _stderr
) -> SpeculationVerdict | None:
    """The verdict kept for ``setup``, or None: none yet, or a file that is not this
    setup's in this schema (said through ``log``; the next write replaces it)."""
    path = verdict_path(setup)
    if not path.exists():
        return None
    try:
        stored = json.loads(path.read_text())
        if stored.get("schema") != SCHEMA or stored.get("setup") != setup:
            raise ValueError("written for another setup or schema")
        verdict = SpeculationVerdict(**stored["verdict"])
        if not isinstance(verdict.pays, bool):
            raise ValueError(f"pays is {verdict.pays!r}, not a bool")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log(f"note: ignoring the speculation verdict in {path} ({exc})")
        return None
    return verdict


def write_verdict(
    setup: dict[str, Any], verdict: SpeculationVerdict, log: Callable[[str], None] = _stderr
) -> None:
    """Keep ``verdict`` for ``setup``, whole or not at all; an unwritable folder is said
    through ``log``, not raised."""
    path = verdict_path(setup)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        body = {"schema": SCHEMA, "setup": setup, "verdict": verdict.as_dict()}
        temporary.write_text(json.dumps(body, indent=1))
        temporary.replace(path)
    except OSError as exc:
        log(f"note: could not keep the speculation verdict in {path}: {exc}")
