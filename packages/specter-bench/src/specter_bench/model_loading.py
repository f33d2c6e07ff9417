"""Where the benchmark meets specter-models: names, configs and loading.

A model argument is a preset name (``deepseek-v2-lite``, ``tiny-deepseek-v2``, ...), the
trained demo ``specter-code-tiny``, or a checkpoint folder. This module resolves it to a
config, to the weights' description recorded in results, and to loaded models.
"""

from __future__ import annotations

import argparse
import gc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specter_models.engine import PLAIN_STREAM_FILLS
from specter_models.engine.model_source import is_checkpoint, load_tokenizer, model_config
from specter_models.tokenizers import ByteTokenizer

__all__ = [
    "FILL_CANDIDATES",
    "STAGING_SLOTS",
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


def tokenizer_name(tokenizer: Any) -> str:
    """What a record says about the tokenizer."""
    if isinstance(tokenizer, ByteTokenizer):
        return "bytes (one id per UTF-8 byte; the preset has no tokenizer)"
    return f"{type(tokenizer).__name__} (vocab {len(tokenizer)})"


FILL_CANDIDATES = PLAIN_STREAM_FILLS
"""Candidate slots per layer of the bench's ``specter-fill`` (a stage that runs it loads a
stream record this wide), as plain streamed decoding fills by default."""

STAGING_SLOTS = 8
"""FP16 experts of the staging buffer of the bench's ``specter-staged`` (a float16 stage that
runs it loads one this large: 138 MB on DeepSeek-V2-Lite, fixed state of that load, which
under a budget is its own)."""


@dataclass(frozen=True)
class EngineOptions:
    """The loader switches every engine system of a run shares.

    Attributes:
        batch_invariant: batch-invariant verification (None: the loader decides, on for
            fp16/bf16 on CUDA).
        cuda_graphs: decode steps as CUDA graphs (None: the loader decides, on for CUDA).
        piecewise_graphs: graph the target under a budget too, piecewise (None: the
            loader decides, on with CUDA graphs).
        miss_path: ``"load"`` or ``"stream"`` (``MemoryConfig.miss_path``); the
            bench's systems set their own before each decode.
        stream_fills: ``MemoryConfig.stream_fills``: candidate slots per layer a
            streamed verification fills, at most (0: none, and no fill launches; a bench
            stage loads with the most its systems use, and each sets its own before a
            decode).
        stream_staging: ``MemoryConfig.stream_staging``: FP16 experts of the
            streamed path's staging buffer (0: none; float16 only; a bench stage loads with
            the most its systems use, and each sets its own before a decode).
        shared_overlap: the shared experts on a side stream (``KernelConfig.shared_overlap``;
            None: the loader decides, on).
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

    def kernel_config(self) -> Any:
        """The ``specter_models.KernelConfig`` of these switches."""
        from specter_models import KernelConfig

        return KernelConfig(
            batch_invariant=self.batch_invariant,
            cuda_graphs=self.cuda_graphs,
            piecewise_graphs=self.piecewise_graphs,
            shared_overlap=self.shared_overlap,
        )


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
    from specter_models import EngineConfig, LoadConfig, MemoryConfig, SpeculationConfig

    config = EngineConfig(
        load=LoadConfig(model=model, device=device, dtype=str(dtype).removeprefix("torch."),
                        weights_seed=seed),
        memory=MemoryConfig(
            gpu_memory_gb=budget_gb,
            slots_per_layer=slots_per_layer,
            miss_path=options.miss_path,
            stream_fills=options.stream_fills,
            stream_staging=options.stream_staging,
            max_seq_len=max_seq_len,
        ),
        kernels=options.kernel_config(),
        speculation=SpeculationConfig(depth="auto" if with_draft else 0),
    )  # fmt: skip
    return specter_models.load(
        config,
        policy=policy,
        hot_experts=hot_experts,
        draft_pruned_experts=draft_pruned_experts if with_draft else None,
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
