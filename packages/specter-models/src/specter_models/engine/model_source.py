"""What a model argument names: a preset, the demo checkpoint or a checkpoint folder.

Resolves it to its transformers config and its tokenizer, and resolves the device and dtype
words of :class:`~specter_models.engine.LoadConfig`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, PretrainedConfig

from specter_models.tokenizers import ByteTokenizer

__all__ = [
    "DTYPES",
    "is_checkpoint",
    "load_tokenizer",
    "model_config",
    "num_experts_of",
    "prompt_ids",
    "resolve_device",
    "resolve_dtype",
]

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")

DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}
"""The dtype names a model loads in."""


def is_checkpoint(model: str) -> bool:
    """Whether ``model`` names a checkpoint folder (a directory holding ``config.json``)."""
    return (Path(model) / "config.json").is_file()


def model_config(model: str) -> PretrainedConfig:
    """The transformers config of a preset, the demo model or a checkpoint folder.

    Raises:
        KeyError: not a preset and not a checkpoint folder (the message lists the presets).
        FileNotFoundError: a folder without ``config.json``, or the demo checkpoint missing
            from this installation.
    """
    import specter_models.presets as presets

    if is_checkpoint(model):
        return AutoConfig.from_pretrained(model)
    if model == presets.DEMO_MODEL:
        return AutoConfig.from_pretrained(presets.demo_model_path())
    if Path(model).exists():
        raise FileNotFoundError(
            f"{model} has no config.json; a checkpoint folder holds config.json and "
            "*.safetensors (as save_pretrained writes them)."
        )
    return presets.preset_config(model)


def num_experts_of(config: PretrainedConfig) -> int:
    """Routed experts per MoE layer of a transformers config."""
    return int(
        getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None) or 1
    )


def load_tokenizer(model: str, vocab_size: int | None = None) -> Any:
    """The checkpoint's tokenizer, or a :class:`ByteTokenizer` for random-weight presets.

    Args:
        model: a preset name, the demo model or a checkpoint folder.
        vocab_size: the model's vocabulary (small test vocabularies fold bytes into it).

    Raises:
        FileNotFoundError: the demo checkpoint is missing from this installation.
    """
    import specter_models.presets as presets

    if model == presets.DEMO_MODEL:
        folder: Path | None = Path(presets.demo_model_path())
    else:
        folder = Path(model) if is_checkpoint(model) else None
    if folder is not None and any((folder / name).is_file() for name in _TOKENIZER_FILES):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(folder)
    return ByteTokenizer(vocab_size=vocab_size)


def resolve_device(text: str) -> str:
    """``auto`` -> ``cuda`` when torch sees a GPU, else ``cpu``; ``cpu``, ``cuda`` and
    ``cuda:N`` are checked.

    Raises:
        ValueError: an unknown device, or CUDA asked for where torch sees none.
    """
    if text == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if text == "cpu":
        return text
    if text == "cuda" or (text.startswith("cuda:") and text[5:].isdigit()):
        if not torch.cuda.is_available():
            raise ValueError(
                f"device {text!r}: torch sees no CUDA GPU here; use device 'cpu' or 'auto'."
            )
        return text
    raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {text!r}.")


def resolve_dtype(name: str | None, device: str) -> torch.dtype:
    """``None`` -> float16 on a GPU, float32 on a CPU; else one of :data:`DTYPES`.

    Raises:
        ValueError: an unknown name.
    """
    if name is None:
        return torch.float16 if device.startswith("cuda") else torch.float32
    if name not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {name!r}.")
    return DTYPES[name]


def prompt_ids(tokenizer: Any, prompt: str | Sequence[int], what: str) -> list[int]:
    """``prompt``'s token ids (text encoded with ``tokenizer``).

    Raises:
        ValueError: an empty prompt (``what`` names it in the message).
    """
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError(f"the {what} is empty; give some text.")
        ids = list(tokenizer.encode(prompt))
    else:
        ids = [int(i) for i in prompt]
    if not ids:
        raise ValueError(f"the {what} has no tokens; give some text or token ids.")
    return ids
