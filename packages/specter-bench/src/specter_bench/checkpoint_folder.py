"""A preset's seeded random weights on disk, with a tokenizer of its vocabulary
(``specter write-checkpoint``).

specter-models' ``write_random_checkpoint`` writes the weights (bit for bit what the engine
builds for the preset and seed on the same device), then
:mod:`~specter_bench.checkpoint_tokenizer` trains a byte-level BPE of the vocabulary's size
on the demo corpus (the running Python's standard library sources) and saves it beside them.
Loading the folder (``--model FOLDER``) then gives Specter, transformers and llama.cpp's
converter the same weights and the same tokenizer. Everything is written into
``FOLDER.partial`` first and renamed to ``FOLDER`` once complete, so a folder of that name is
always whole; a ``.partial`` folder left by an interrupted write is replaced by the next.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["WrittenFolder", "is_complete", "write_checkpoint_folder"]

GB = 1e9


@dataclass(frozen=True)
class WrittenFolder:
    """What :func:`write_checkpoint_folder` wrote.

    Attributes:
        folder: the checkpoint folder.
        weights: the weights' summary (``CheckpointSummary``).
        tokenizer: the tokenizer's summary (``TokenizerSummary``), None when the model's
            vocabulary is too small for a byte-level BPE (tiny test presets).
    """

    folder: Path
    weights: object
    tokenizer: object | None


def is_complete(folder: str | os.PathLike[str]) -> bool:
    """Whether ``folder`` is a finished ``write_checkpoint_folder`` output."""
    from specter_models.checkpoint_writer import read_marker

    return read_marker(folder) is not None


def write_checkpoint_folder(
    preset: str,
    out: str | os.PathLike[str],
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float16,
    device: str | None = None,
    max_shard_bytes: int = 5 * 10**9,
    tokenizer: bool = True,
    say: Callable[[str], None] = print,
) -> WrittenFolder:
    """Write ``preset``'s weights and a tokenizer of its vocabulary into ``out``.

    Args:
        preset: a preset name.
        out: a new (or empty) folder.
        seed: the random-weight seed.
        dtype: the weights' dtype.
        device: where the values are generated (default: CUDA when available, as the
            engine builds them).
        max_shard_bytes: the most tensor bytes per safetensors file.
        tokenizer: write the tokenizer (a vocabulary under 258 ids, too small for one, is
            skipped, said so).
        say: progress lines.

    Raises:
        KeyError: an unknown preset.
        FileExistsError: ``out`` exists and is not empty.
        TypeError: an unsupported dtype.
    """
    from specter_bench.checkpoint_tokenizer import write_checkpoint_tokenizer
    from specter_bench.training.corpus import load_stdlib_corpus
    from specter_models.checkpoint_writer import write_random_checkpoint
    from specter_models.presets import get_preset

    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(
            f"{out} already exists and is not an empty folder; give a new folder (or remove "
            "this one) to write the checkpoint into"
        )
    config = get_preset(preset).make_config()
    partial = out.with_name(out.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)  # an earlier write cut short
    say(f"writing {preset} (seed {seed}, {str(dtype).replace('torch.', '')}) to {out}")
    weights = write_random_checkpoint(
        preset,
        partial,
        seed=seed,
        dtype=dtype,
        device=device,
        max_shard_bytes=max_shard_bytes,
        progress=say,
    )
    say(
        f"weights: {weights.tensors} tensors, {weights.total_bytes / GB:.2f} GB in "
        f"{weights.shards} files, generated on {weights.device}, {weights.seconds:.0f} s"
    )
    if not tokenizer or config.vocab_size < 258:
        if tokenizer:
            say(
                f"no tokenizer: a vocabulary of {config.vocab_size} ids has no room for a "
                "byte-level BPE; prompts fall back to UTF-8 bytes"
            )
        _finish(partial, out)
        return WrittenFolder(out, weights, None)
    corpus = load_stdlib_corpus()
    texts = [f.text for f in (*corpus.train, *corpus.heldout)]
    summary = write_checkpoint_tokenizer(
        partial,
        texts,
        vocab_size=int(config.vocab_size),
        bos_token_id=int(config.bos_token_id),
        eos_token_id=int(config.eos_token_id),
        model_max_length=int(config.max_position_embeddings),
        corpus={
            "name": "Python standard library sources",
            "python_version": corpus.python_version,
            "files": len(texts),
            "sha256": corpus.sha256,
        },
    )
    say(
        f"tokenizer: {summary.trained_tokens} trained tokens, {summary.placeholder_tokens} "
        f"placeholders, sha256 {summary.sha256[:12]}, {summary.seconds:.0f} s"
    )
    _finish(partial, out)
    return WrittenFolder(out, weights, summary)


def _finish(partial: Path, out: Path) -> None:
    if out.exists():
        out.rmdir()  # the empty folder the caller named
    partial.rename(out)
