"""``specter llama-cpp all``: checkpoint, GGUF files and measurements, step by step on one disk.

A full-size model in FP16 is 31 GB (DeepSeek-V2-Lite) and the checkpoint and its F16 GGUF
cannot both stay on a 64 GB disk with the quantized copies, so the chain writes the
checkpoint, converts it to F16, deletes it, quantizes the F16 file to each other type and
the draft's, then measures. Each step is skipped when its output exists, so a chain cut by
a time limit resumes where it stopped when run again; ``steps`` runs a subset, to split the
chain over several commands. Every step prints its time.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from specter_bench.llama_cpp.files import check_free_disk, convert_checkpoint, quantize_gguf
from specter_bench.llama_cpp.invocations import LlamaCppError, LlamaCppTree
from specter_bench.llama_cpp.measure import MeasureConfig, measure

__all__ = ["CHAIN_STEPS", "ChainConfig", "gguf_path", "run_chain"]

CHAIN_STEPS = ("checkpoint", "convert", "quantize", "bench")
DEFAULT_WORK = Path(".llama.cpp/models")
GB = 1e9


@dataclass(frozen=True)
class ChainConfig:
    """What ``specter llama-cpp all`` makes and measures.

    Attributes:
        model: the preset.
        seed: its random-weight seed.
        work: the folder of the GGUF files.
        checkpoint: where the checkpoint is written (default ``work/MODEL``; a folder in
            host memory such as ``/dev/shm/MODEL`` spares the disk).
        types: the target's weights to measure (``f16`` first: the others are made from it).
        draft_type: the draft's weights for speculative decoding (None: none).
        keep_checkpoint: keep the checkpoint after converting it.
        steps: the steps to run, of :data:`CHAIN_STEPS`.
        measure: the measurement's settings (its ``gguf`` and ``draft`` are set per type).
        threads: CPU threads of ``llama-quantize``.
    """

    model: str
    seed: int = 0
    work: Path = DEFAULT_WORK
    checkpoint: Path | None = None
    types: tuple[str, ...] = ("f16", "q8_0")
    draft_type: str | None = None
    keep_checkpoint: bool = False
    steps: tuple[str, ...] = CHAIN_STEPS
    measure: MeasureConfig = field(default_factory=lambda: MeasureConfig(gguf=Path()))
    threads: int | None = None


def gguf_path(work: Path, model: str, weights: str) -> Path:
    """``WORK/MODEL-WEIGHTS.gguf``."""
    return work / f"{model}-{weights}.gguf"


def run_chain(
    tree: LlamaCppTree, config: ChainConfig, say: Callable[[str], None] = print
) -> list[dict]:
    """Run the chain's steps; returns the records measured.

    Raises:
        ValueError: an unknown step, or types without ``f16``.
        LlamaCppError: a tool missing or failing, too little disk, or an unfinished
            checkpoint folder in the way.
    """
    unknown = [s for s in config.steps if s not in CHAIN_STEPS]
    if unknown:
        raise ValueError(f"unknown steps {unknown}; steps are {', '.join(CHAIN_STEPS)}")
    if "f16" not in config.types:
        raise ValueError(
            f"types must include f16 (the others are made from it), got {config.types}"
        )
    checkpoint = config.checkpoint or config.work / config.model
    f16 = gguf_path(config.work, config.model, "f16")
    logs = config.work / "logs"
    timings: dict[str, float] = {}

    def step(name: str, action: Callable[[], object]) -> None:
        start = time.perf_counter()
        action()
        timings[name] = time.perf_counter() - start
        say(f"[{name}] {timings[name]:.0f} s")

    if "checkpoint" in config.steps and not f16.exists():
        step("checkpoint", lambda: _write_checkpoint(config, checkpoint, say))
    if "convert" in config.steps and not f16.exists():
        step(
            "convert",
            lambda: convert_checkpoint(tree, checkpoint, "f16", f16, log_dir=logs, say=say),
        )
        if not config.keep_checkpoint:
            from specter_models.checkpoint_writer import remove_checkpoint

            remove_checkpoint(checkpoint)
            say(f"removed {checkpoint}")
    if "quantize" in config.steps:
        wanted = [t for t in (*config.types, config.draft_type) if t and t != "f16"]
        for qtype in dict.fromkeys(wanted):
            out = gguf_path(config.work, config.model, qtype)
            if not out.exists():
                step(
                    f"quantize {qtype}",
                    lambda out=out, qtype=qtype: quantize_gguf(
                        tree, f16, qtype, out, log_dir=logs, threads=config.threads, say=say
                    ),
                )
    records: list[dict] = []
    if "bench" in config.steps:
        for weights in config.types:
            target = dataclasses.replace(
                config.measure,
                gguf=gguf_path(config.work, config.model, weights),
                draft=None,
                model_label=config.measure.model_label or config.model,
                log_dir=logs,
            )
            step(
                f"bench {weights}", lambda target=target: records.extend(measure(tree, target, say))
            )
        if config.draft_type:
            spec = dataclasses.replace(
                target,
                gguf=f16,
                draft=gguf_path(config.work, config.model, config.draft_type),
                skip_plain=True,
            )
            step(
                f"speculative f16 + {config.draft_type}",
                lambda: records.extend(measure(tree, spec, say)),
            )
    say("step times: " + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()))
    return records


def _write_checkpoint(config: ChainConfig, folder: Path, say: Callable[[str], None]) -> None:
    from specter_bench.checkpoint_folder import is_complete, write_checkpoint_folder
    from specter_models.checkpoint_writer import plan_tensors

    if is_complete(folder):
        say(f"{folder} is already written")
        return
    if folder.exists() and any(folder.iterdir()):
        raise LlamaCppError(
            f"{folder} is in the way: it holds files but no specter_checkpoint.json; remove it "
            "or give another --checkpoint-dir"
        )
    import torch

    specs, _ = plan_tensors(config.model, seed=config.seed, dtype=torch.float16, device="meta")
    needed = 2 * sum(torch.Size(s.shape).numel() for s in specs)
    check_free_disk(folder.parent, needed + 0.1 * GB, f"the {config.model} checkpoint")
    write_checkpoint_folder(config.model, folder, seed=config.seed, say=say)
