"""The draft's INT4 experts from a GPTQ checkpoint of the same model.

A GPTQ checkpoint stores each quantized linear as ``<name>.qweight`` (int32 ``[K/8, N]``),
``<name>.qzeros`` (int32 ``[K/G, N/8]``), ``<name>.scales`` (``[K/G, N]``) and optionally
``<name>.g_idx``, with the quantization settings in ``quantize_config.json`` or in
``config.json``'s ``quantization_config``. Only the routed experts are read (the draft shares
every other tensor with the FP16 target); specter-kernels' ``import_gptq`` converts each
linear, gate and up are joined along the output dimension, and each layer's experts are
stacked.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from specter_kernels import (
    SUPPORTED_GROUP_SIZES,
    Int4Weight,
    concat_gate_up,
    import_gptq,
    stack_int4_experts,
)
from specter_models.architecture import Architecture, MoeLayer
from specter_models.checkpoint import CheckpointFiles, read_json


@dataclass(frozen=True)
class GptqSettings:
    """The quantization settings of a GPTQ checkpoint.

    Attributes:
        bits: bits per weight (must be 4).
        group_size: inputs per scale.
        sym: symmetric quantization (zero point 8).
        desc_act: act-order (refused by the import).
        checkpoint_format: ``"gptq"`` (v1, zero - 1 stored) or ``"gptq_v2"``.
    """

    bits: int
    group_size: int
    sym: bool
    desc_act: bool
    checkpoint_format: str


def read_gptq_settings(folder: str | os.PathLike[str]) -> GptqSettings:
    """Read ``quantize_config.json`` (or ``config.json``'s ``quantization_config``).

    Raises:
        FileNotFoundError: ``folder`` is not a directory.
        ValueError: no GPTQ settings, another quantization method, or unsupported values.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"GPTQ draft checkpoint {folder} is not a folder")
    settings: dict | None = None
    if (folder / "quantize_config.json").is_file():
        settings = dict(read_json(folder / "quantize_config.json"))
    elif (folder / "config.json").is_file():
        settings = read_json(folder / "config.json").get("quantization_config")  # type: ignore[assignment]
    if not isinstance(settings, dict):
        raise ValueError(
            f"{folder} is not a GPTQ checkpoint: no quantize_config.json and no "
            "quantization_config in config.json. Pass draft='rtn' to quantize the experts on load."
        )
    method = settings.get("quant_method", "gptq")
    if method != "gptq":
        raise ValueError(f"{folder}: quant_method={method!r}; only GPTQ checkpoints are supported")
    out = GptqSettings(
        bits=int(settings.get("bits", 4)),
        group_size=int(settings.get("group_size", 128)),
        sym=bool(settings.get("sym", True)),
        desc_act=bool(settings.get("desc_act", False)),
        checkpoint_format=str(settings.get("checkpoint_format", "gptq")),
    )
    if out.bits != 4:
        raise ValueError(f"{folder}: bits={out.bits}; the draft kernels need 4-bit weights")
    if out.group_size not in SUPPORTED_GROUP_SIZES:
        raise ValueError(
            f"{folder}: group_size={out.group_size}; the draft kernels support "
            f"{SUPPORTED_GROUP_SIZES}. Re-quantize with one of them or use draft='rtn'."
        )
    return out


def load_gptq_draft(
    folder: str | os.PathLike[str],
    arch: Architecture,
    moe_layers: Sequence[MoeLayer],
    device: torch.device | str,
) -> list[tuple[Int4Weight, Int4Weight]]:
    """Import every routed expert of a GPTQ checkpoint as the draft's INT4 weights.

    Args:
        folder: the GPTQ checkpoint folder (safetensors and settings).
        arch: the target's architecture (expert names).
        moe_layers: the target's MoE layers (expected shapes).
        device: where the INT4 weights go.

    Returns:
        Per MoE layer, ``(gate_up [E, 2I, H], down [E, H, I])``.

    Raises:
        ValueError: settings, names, shapes or group sizes that do not match the target.
        FileNotFoundError: no weights in the folder.
    """
    settings = read_gptq_settings(folder)
    config_path = Path(folder) / "config.json"
    if config_path.is_file():
        model_type = read_json(config_path).get("model_type")
        if model_type is not None and model_type != arch.model_type:
            raise ValueError(
                f"GPTQ draft {folder} is a {model_type!r} model, the target is {arch.model_type!r}"
            )
    files = CheckpointFiles(folder)
    try:
        layers = []
        for layer in moe_layers:
            gate_ups: list[Int4Weight] = []
            downs: list[Int4Weight] = []
            H, I = layer.hidden_size, layer.intermediate_size
            for e in range(layer.num_experts):
                keys = arch.expert_keys(layer.decoder_layer, e)
                gate = _import_linear(files, keys["gate"], settings, (I, H))
                up = _import_linear(files, keys["up"], settings, (I, H))
                down = _import_linear(files, keys["down"], settings, (H, I))
                gate_ups.append(concat_gate_up(gate, up))
                downs.append(down)
            layers.append(
                (stack_int4_experts(gate_ups).to(device), stack_int4_experts(downs).to(device))
            )
        return layers
    finally:
        files.close()


def _import_linear(
    files: CheckpointFiles,
    weight_key: str,
    settings: GptqSettings,
    shape: tuple[int, int],
) -> Int4Weight:
    """One GPTQ linear (``<name>.qweight`` etc. for the FP16 key ``<name>.weight``)."""
    base = weight_key.removesuffix(".weight")
    tensors = {}
    for part in ("qweight", "qzeros", "scales"):
        key = f"{base}.{part}"
        if key not in files:
            raise ValueError(
                f"GPTQ draft {files.folder}: {key!r} is missing; the draft checkpoint must hold "
                "every routed expert of the target under the target's names"
            )
        tensors[part] = files.read(key)
    g_idx_key = f"{base}.g_idx"
    g_idx = files.read(g_idx_key) if g_idx_key in files else None
    weight = import_gptq(
        tensors["qweight"],
        tensors["qzeros"],
        tensors["scales"],
        g_idx,
        bits=settings.bits,
        sym=settings.sym,
        checkpoint_format=settings.checkpoint_format,  # type: ignore[arg-type]
        desc_act=settings.desc_act,
    )
    out_features, in_features = shape
    if (weight.out_features, weight.in_features) != (out_features, in_features):
        raise ValueError(
            f"GPTQ draft {files.folder}: {base} is [N={weight.out_features}, "
            f"K={weight.in_features}], the target's weight is [{out_features}, {in_features}]"
        )
    if weight.group_size != settings.group_size:
        raise ValueError(
            f"GPTQ draft {files.folder}: {base} has group size {weight.group_size}, the "
            f"checkpoint's settings say {settings.group_size}"
        )
    return weight
