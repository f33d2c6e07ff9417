"""Where the benchmark meets specter-models: names, configs and loading.

A model argument is a preset name (``deepseek-v2-lite``, ``tiny-deepseek-v2``, ...), the
trained demo ``specter-code-tiny``, or a checkpoint folder. This module resolves it to a
config, to the weights' description recorded in results, and to loaded models.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, PretrainedConfig

from specter_bench.prompt_encoding import ByteTokenizer

__all__ = [
    "EngineOptions",
    "build_hf_model",
    "is_checkpoint",
    "load_engine",
    "load_tokenizer",
    "model_config",
    "model_name",
    "release_memory",
    "tokenizer_name",
    "weights_description",
]

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def is_checkpoint(model: str) -> bool:
    """Whether ``model`` names a checkpoint folder (a directory holding ``config.json``)."""
    return (Path(model) / "config.json").is_file()


def model_config(model: str) -> PretrainedConfig:
    """The transformers config of a preset, the demo model or a checkpoint folder.

    Raises:
        KeyError: not a preset and not a checkpoint folder (the message lists the presets).
        FileNotFoundError: the demo checkpoint is missing from this installation.
    """
    from specter_models.presets import DEMO_MODEL, demo_model_path, preset_config

    if is_checkpoint(model):
        return AutoConfig.from_pretrained(model)
    if model == DEMO_MODEL:
        return AutoConfig.from_pretrained(demo_model_path())
    if Path(model).exists():
        raise FileNotFoundError(
            f"{model} has no config.json; a checkpoint folder holds config.json and "
            "*.safetensors (as save_pretrained writes them)."
        )
    return preset_config(model)


def weights_description(model: str, seed: int) -> str:
    """What a record says about the weights: a checkpoint path, or random with its seed."""
    from specter_models.presets import DEMO_MODEL, demo_model_path

    if is_checkpoint(model):
        return f"checkpoint {Path(model).resolve()}"
    if model == DEMO_MODEL:
        return f"checkpoint {DEMO_MODEL} (trained demo, {demo_model_path()})"
    return f"random (seed {seed})"


def model_name(model: str) -> str:
    """A short name for files and tables: the preset, or the checkpoint folder's name."""
    return Path(model).name if is_checkpoint(model) else model


def load_tokenizer(model: str, vocab_size: int | None = None) -> Any:
    """The checkpoint's tokenizer, or a :class:`ByteTokenizer` for random-weight presets.

    Args:
        model: the model argument.
        vocab_size: the model's vocabulary (small test vocabularies fold bytes into it).

    Raises:
        FileNotFoundError: the demo checkpoint is missing from this installation.
    """
    from specter_models.presets import DEMO_MODEL, demo_model_path

    folder = (
        demo_model_path() if model == DEMO_MODEL else Path(model) if is_checkpoint(model) else None
    )
    if folder is not None and any((folder / name).is_file() for name in _TOKENIZER_FILES):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(folder)
    return ByteTokenizer(vocab_size=vocab_size)


def tokenizer_name(tokenizer: Any) -> str:
    """What a record says about the tokenizer."""
    if isinstance(tokenizer, ByteTokenizer):
        return "bytes (one id per UTF-8 byte; the preset has no tokenizer)"
    return f"{type(tokenizer).__name__} (vocab {len(tokenizer)})"


FILL_CANDIDATES = 8
"""Candidate slots per layer of the bench's ``specter-fill`` (a stage that runs it loads a
stream record this wide)."""

STAGING_SLOTS = 8
"""FP16 experts of the staging buffer of the bench's ``specter-staged`` (a float16 stage that
runs it loads one this large: 138 MB on DeepSeek-V2-Lite, fixed state of that load, which
under a budget is its own)."""


@dataclass(frozen=True)
class EngineOptions:
    """The ``specter_models.load`` switches every engine system of a run shares.

    Attributes:
        batch_invariant: batch-invariant verification (None: the loader decides, on for
            fp16/bf16 on CUDA).
        cuda_graphs: decode steps as CUDA graphs (None: the loader decides, on for CUDA).
        piecewise_graphs: graph the target under a budget too, piecewise (None: the
            loader decides, on with CUDA graphs).
        miss_path: ``"load"`` or ``"stream"`` (``specter_models.load(miss_path=)``); the
            bench's systems set their own before each decode.
        stream_fills: ``specter_models.load(stream_fills=)``: candidate slots per layer a
            streamed verification fills, at most (0: none, and no fill launches; a bench
            stage loads with the most its systems use, and each sets its own before a
            decode).
        stream_staging: ``specter_models.load(stream_staging=)``: FP16 experts of the
            streamed path's staging buffer (0: none; float16 only; a bench stage loads with
            the most its systems use, and each sets its own before a decode).
        shared_overlap: the shared experts on a side stream (``specter_models.load(
            shared_overlap=)``; None: the loader decides, on).
    """

    batch_invariant: bool | None = None
    cuda_graphs: bool | None = None
    piecewise_graphs: bool | None = None
    miss_path: str = "load"
    stream_fills: int = 0
    stream_staging: int = 0
    shared_overlap: bool | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> EngineOptions:
        """The switches of a parsed ``specter`` command line (its model arguments); a miss
        path or fill count left to ``auto`` (``generate`` resolves its own first) loads and
        fills nothing."""
        miss_path = getattr(args, "miss_path", "load")
        return cls(
            args.batch_invariant,
            args.cuda_graphs,
            args.piecewise_graphs,
            "load" if miss_path == "auto" else miss_path,
            getattr(args, "stream_fills", None) or 0,
            getattr(args, "stream_staging", 0),
            getattr(args, "shared_overlap", None),
        )

    def load_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``specter_models.load``."""
        return dataclasses.asdict(self)


def load_engine(
    model: str,
    *,
    budget_gb: float | None,
    with_draft: bool,
    policy: str,
    device: str,
    dtype: torch.dtype,
    seed: int,
    max_seq_len: int,
    slots_per_layer: int | None = None,
    options: EngineOptions = EngineOptions(),
    hot_experts: list[list[int]] | None = None,
    draft_pruned_experts: list[list[int]] | None = None,
) -> Any:
    """``specter_models.load`` of the benchmark's model at one budget.

    ``slots_per_layer`` replaces the budget when given (the two are exclusive); ``options``
    are the shared switches (batch invariance, CUDA graphs); ``hot_experts`` a pinned hot
    set (``specter_models.choose_hot_experts``), ``draft_pruned_experts`` the experts its
    draft skips (the choice's ``pruned_experts``).

    Raises:
        ValueError, MemoryBudgetError, FileNotFoundError: from ``specter_models.load``.
    """
    import specter_models

    return specter_models.load(
        model,
        gpu_memory_gb=budget_gb,
        slots_per_layer=slots_per_layer,
        device=device,
        dtype=dtype,
        draft="rtn" if with_draft else None,
        policy=policy,
        seed=seed,
        max_seq_len=max_seq_len,
        hot_experts=hot_experts,
        draft_pruned_experts=draft_pruned_experts if with_draft else None,
        **options.load_kwargs(),
    )


def build_hf_model(model: str, *, device: str, dtype: torch.dtype, seed: int) -> Any:
    """transformers' own model with the engine's weights, every weight on ``device``.

    Presets are rebuilt from their seed on the device (``build_reference_model``: the same
    values as the engine's); checkpoints load with ``from_pretrained``.
    """
    from specter_models import build_reference_model
    from specter_models.presets import DEMO_MODEL, demo_model_path

    if model == DEMO_MODEL or is_checkpoint(model):
        from transformers import AutoModelForCausalLM

        folder = demo_model_path() if model == DEMO_MODEL else Path(model)
        hf = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device)
        if dtype == torch.float64:
            hf.set_experts_implementation("eager")  # grouped_mm has no float64 kernel
        return hf.eval()
    return build_reference_model(model, seed=seed, device=device, dtype=dtype).eval()


def release_memory(*, host: bool = False) -> None:
    """Collect garbage and return cached device memory after a stage.

    Args:
        host: also return torch's cached pinned host blocks to the system. Off between
            engine loads on purpose: the next load's expert store reuses those blocks
            instead of pinning tens of GB again.
    """
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        empty_host = getattr(torch._C, "_host_emptyCache", None)
        if host and empty_host is not None:
            empty_host()
