"""GGUF files made from a written checkpoint: conversion, quantization and what each came from.

Beside every GGUF written here lies ``FILE.gguf.json`` (the preset, seed and generator
device of the weights, the weights' type, the tokenizer's digest, the tool and its time) and
``FILE.gguf.tokenizer/`` (the checkpoint's tokenizer files, 5-7 MB), so that a benchmark of
the file can name the model as Specter's records do and cut prompts with the same tokenizer
after the checkpoint itself is deleted. Outputs are written under a ``.partial`` name and
renamed when complete, so an interrupted step leaves no file that looks finished.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specter_bench.llama_cpp.invocations import (
    LlamaCppError,
    LlamaCppTree,
    convert_argv,
    quantize_argv,
    run_logged,
)

__all__ = [
    "check_free_disk",
    "convert_checkpoint",
    "quantize_gguf",
    "read_origin",
    "tokenizer_copy",
]

GB = 1e9
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
_BYTES_PER_WEIGHT = {"f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32}


def read_origin(gguf: str | os.PathLike[str]) -> dict[str, Any]:
    """``FILE.gguf.json``: what a GGUF written here came from (empty for other files)."""
    path = Path(str(gguf) + ".json")
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    return data if isinstance(data, dict) else {}


def tokenizer_copy(gguf: str | os.PathLike[str]) -> Path | None:
    """The tokenizer folder kept beside a GGUF written here, or None."""
    folder = Path(str(gguf) + ".tokenizer")
    return folder if (folder / "tokenizer.json").is_file() else None


def check_free_disk(folder: Path, needed_bytes: float, what: str) -> None:
    """Refuse to start a step that cannot fit on the disk.

    Raises:
        LlamaCppError: less than ``needed_bytes`` free at ``folder`` (the message says how
            much is free and what to do).
    """
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    if free < needed_bytes:
        raise LlamaCppError(
            f"{what} needs about {needed_bytes / GB:.1f} GB free at {folder}, which has "
            f"{free / GB:.1f} GB; delete what the step no longer needs (the checkpoint once "
            "converted) or write elsewhere"
        )


def convert_checkpoint(
    tree: LlamaCppTree,
    checkpoint: Path,
    outtype: str,
    out: Path,
    *,
    log_dir: Path,
    say: Callable[[str], None] = print,
) -> Path:
    """Convert a checkpoint folder to a GGUF of ``outtype`` with llama.cpp's converter.

    A checkpoint written by ``specter write-checkpoint`` carries the pre-tokenizer to name
    (see ``checkpoint_tokenizer``); any other is left to the converter's own recognition.

    Raises:
        FileNotFoundError: no ``config.json`` in ``checkpoint``.
        FileExistsError: ``out`` exists.
        LlamaCppError: no source tree, too little disk, or the converter failed.
    """
    from specter_bench.checkpoint_tokenizer import read_tokenizer_marker
    from specter_models.checkpoint_writer import read_marker

    if not (checkpoint / "config.json").is_file():
        raise FileNotFoundError(
            f"{checkpoint} holds no config.json; give a checkpoint folder (write one with "
            "`specter write-checkpoint`)"
        )
    if out.exists():
        raise FileExistsError(f"{out} exists; remove it or give another --out")
    weights = sum(p.stat().st_size for p in checkpoint.glob("*.safetensors"))
    check_free_disk(
        out.parent, weights * _BYTES_PER_WEIGHT.get(outtype, 2.0) / 2.0, f"the {outtype} GGUF"
    )
    marker = read_marker(checkpoint) or {}
    tokenizer = read_tokenizer_marker(checkpoint) or {}
    partial = out.with_name(out.name + ".partial")
    partial.unlink(missing_ok=True)
    argv = convert_argv(
        tree,
        checkpoint,
        outtype,
        partial,
        pre_tokenizer=tokenizer.get("llama_cpp_pre_tokenizer"),
    )
    say(f"converting {checkpoint} to {outtype} ({weights / GB:.1f} GB of safetensors)")
    _, seconds = run_logged(argv, log_dir / f"{out.name}.convert.log", echo=False)
    partial.rename(out)
    tokenizers = Path(str(out) + ".tokenizer")
    if tokenizer:
        tokenizers.mkdir(exist_ok=True)
        for name in _TOKENIZER_FILES:
            if (checkpoint / name).is_file():
                shutil.copy2(checkpoint / name, tokenizers / name)
    origin = {
        "weights": outtype,
        "checkpoint": marker,
        "tokenizer": tokenizer,
        "made_by": "convert_hf_to_gguf.py",
        "seconds": round(seconds, 1),
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    Path(str(out) + ".json").write_text(json.dumps(origin, indent=2) + "\n")
    say(f"wrote {out} ({out.stat().st_size / GB:.2f} GB) in {seconds:.0f} s")
    return out


def quantize_gguf(
    tree: LlamaCppTree,
    source: Path,
    qtype: str,
    out: Path,
    *,
    log_dir: Path,
    threads: int | None = None,
    say: Callable[[str], None] = print,
) -> Path:
    """Quantize an F16 GGUF to ``qtype`` with ``llama-quantize``.

    Raises:
        FileNotFoundError: no ``source``.
        FileExistsError: ``out`` exists.
        LlamaCppError: ``llama-quantize`` missing or failed, or too little disk.
    """
    if not source.is_file():
        raise FileNotFoundError(f"no GGUF at {source}; convert the checkpoint first")
    if out.exists():
        raise FileExistsError(f"{out} exists; remove it or give another --out")
    size = source.stat().st_size
    check_free_disk(out.parent, size * _BYTES_PER_WEIGHT.get(qtype, 1.0) / 2.0, f"the {qtype} GGUF")
    partial = out.with_name(out.name + ".partial")
    partial.unlink(missing_ok=True)
    argv = quantize_argv(tree, source, partial, qtype, threads)
    say(f"quantizing {source} to {qtype}")
    _, seconds = run_logged(argv, log_dir / f"{out.name}.quantize.log", env=tree.env(), echo=False)
    partial.rename(out)
    origin = dict(read_origin(source))
    origin.update(
        weights=qtype,
        quantized_from=str(source),
        made_by="llama-quantize",
        seconds=round(seconds, 1),
        written_at=time.strftime("%Y-%m-%dT%H:%M:%S"),
    )
    Path(str(out) + ".json").write_text(json.dumps(origin, indent=2) + "\n")
    if (copy := tokenizer_copy(source)) is not None:
        shutil.copytree(copy, Path(str(out) + ".tokenizer"), dirs_exist_ok=True)
    say(f"wrote {out} ({out.stat().st_size / GB:.2f} GB) in {seconds:.0f} s")
    return out
