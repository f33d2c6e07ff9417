"""What an adaptive depth measured, kept for the next engine of the same setup.

The adaptive depth (specter-spec ``AdaptiveDepth``) starts knowing no draft or verify time,
so a one-shot generation spends its first iterations exploring depths (plain steps among
them) that a warmed-up policy would not run: on DeepSeek-V2-Lite at 24 GB on one H200,
``--depth auto`` took 8.4-8.7 ms a token over 64 tokens where ``--depth 2``, the depth a
warmed-up policy holds there, took 6.7-7.6. So the engine writes the costs its
policy measured (``AdaptiveDepth.export_costs``: times per depth and per verified row count,
overheads; not the acceptance, which belongs to a prompt) to a small JSON file after each
run, and primes the next run's policy with them (``AdaptiveDepth.prime``), as Triton keeps
its compiled kernels. The file is keyed by everything those times depend on
(:func:`setup_key`): the model, device, dtype, budget, slots, pinned and pruned experts,
miss path, batch invariance, CUDA graphs, the largest depth and the torch, triton and
specter-spec versions.

The folder is ``$SPECTER_CACHE_DIR/depth-costs`` (default ``~/.cache/specter/depth-costs``).
A file that cannot be read or used is reported and replaced, never trusted.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "CACHE_ENV_VAR",
    "depth_costs_path",
    "engine_setup",
    "read_depth_costs",
    "recall_depth_costs",
    "setup_key",
    "write_depth_costs",
]

CACHE_ENV_VAR = "SPECTER_CACHE_DIR"
"""The folder Specter keeps what it measured in (default ``~/.cache/specter``)."""
SCHEMA = 1


def _stderr(line: str) -> None:
    print(line, file=sys.stderr)


def setup_key(**setup: Any) -> dict[str, Any]:
    """The setup a depth-costs file belongs to: ``setup`` (JSON values) in a fixed order."""
    for name, value in setup.items():
        if not isinstance(value, str | int | float | bool | type(None)):
            raise TypeError(f"setup value {name}={value!r} must be a JSON scalar")
    return dict(sorted(setup.items()))


def setup_file(setup: dict[str, Any], folder: str) -> Path:
    """The file of ``setup`` (a :func:`setup_key`) in ``folder`` of the cache folder."""
    root = os.environ.get(CACHE_ENV_VAR) or str(Path.home() / ".cache" / "specter")
    digest = hashlib.sha256(json.dumps(setup, sort_keys=True).encode()).hexdigest()[:20]
    return Path(root) / folder / f"{digest}.json"


def depth_costs_path(setup: dict[str, Any]) -> Path:
    """The file of ``setup`` (a :func:`setup_key`) under the cache folder."""
    return setup_file(setup, "depth-costs")


def model_and_versions(model: str, device: str) -> dict[str, Any]:
    """The parts of every setup key that name the model (a checkpoint folder resolved), the
    device and the versions whose kernels step times depend on."""
    import triton

    import specter_spec

    folder = Path(model)
    return {
        "model": str(folder.resolve()) if folder.exists() else model,
        "device": torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "specter_spec": specter_spec.__version__,
    }


def read_depth_costs(
    path: Path, setup: dict[str, Any], log: Callable[[str], None] = _stderr
) -> dict[str, Any] | None:
    """The costs stored at ``path`` for ``setup``, or None: no file yet, or one that is not
    this setup's costs in this schema (said through ``log``; the next write replaces it)."""
    if not path.exists():
        return None
    try:
        stored = json.loads(path.read_text())
        if stored.get("schema") != SCHEMA or stored.get("setup") != setup:
            raise ValueError("written for another setup or schema")
        costs = stored["costs"]
        if not isinstance(costs, dict):
            raise ValueError(f"costs is {type(costs).__name__}, not an object")
    except (OSError, ValueError, KeyError, AttributeError) as exc:
        log(f"note: ignoring the depth costs in {path} ({exc}); this run replaces them")
        return None
    return costs


def write_depth_costs(
    path: Path,
    setup: dict[str, Any],
    costs: dict[str, Any],
    log: Callable[[str], None] = _stderr,
) -> None:
    """Store ``costs`` (``AdaptiveDepth.export_costs()``) for ``setup`` at ``path``, whole
    or not at all (a temporary file renamed over it). An unwritable folder is said through
    ``log``, not raised: the generation it follows has succeeded."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(
            json.dumps({"schema": SCHEMA, "setup": setup, "costs": costs}, indent=1)
        )
        temporary.replace(path)
    except OSError as exc:
        log(f"note: could not keep the depth costs in {path}: {exc}")


def engine_setup(
    model: str,
    loaded: Any,
    *,
    device: str,
    dtype: torch.dtype,
    budget_gb: float | None,
    max_depth: int,
) -> dict[str, Any]:
    """The :func:`setup_key` of ``loaded`` (a ``SpecterModel`` of ``model``, a preset or a
    checkpoint folder) on ``device``: what its decode's step times depend on."""
    plan = loaded.memory.plan
    return setup_key(
        **model_and_versions(model, device),
        dtype=str(dtype),
        budget_gb=budget_gb,
        slots_per_layer=plan.slots_per_layer,
        hot_experts_per_layer=plan.hot_experts_per_layer,
        pruned_experts_per_layer=plan.pruned_experts_per_layer,
        draft=loaded.draft is not None,
        miss_path=getattr(loaded, "miss_path", "load"),
        stream_fills=getattr(loaded, "stream_fills", 0),
        stream_staging=getattr(loaded, "stream_staging", 0),
        batch_invariant=bool(loaded.batch_invariant),
        cuda_graphs=bool(loaded.cuda_graphs),
        max_depth=max_depth,
    )


def recall_depth_costs(
    policy: Any, setup: dict[str, Any], log: Callable[[str], None] = _stderr
) -> tuple[Path, bool]:
    """Prime ``policy`` (a fresh ``AdaptiveDepth``) with the costs kept for ``setup``, where
    there are usable ones; ``(their file, whether it was primed)``."""
    path = depth_costs_path(setup)
    costs = read_depth_costs(path, setup, log)
    if costs is None:
        return path, False
    try:
        policy.prime(costs)
    except ValueError as exc:
        log(f"note: ignoring the depth costs in {path} ({exc})")
        return path, False
    log(
        f"--depth auto starts from the step costs an earlier run of this setup measured "
        f"({path}; --no-depth-memory ignores them)"
    )
    return path, True
