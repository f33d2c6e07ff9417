"""Unmodified transformers models holding the same weights as a Specter model.

The ``hf`` baseline and every equivalence check compare Specter against transformers' own
model with every weight resident. ``build_reference_model`` rebuilds a preset from its seed
(tensor by tensor, so the values equal the engine's when both are built on one device);
``reference_model_from`` copies a loaded Specter model's weights (non-expert parameters
from the device, routed experts from the host store, one at a time).
"""

from __future__ import annotations

import copy

import torch
from transformers import PreTrainedModel

from specter_models.architecture import architecture_for, find_moe_layers
from specter_models.model_builder import build_on_meta, materialize
from specter_models.presets import get_preset
from specter_models.random_weights import init_non_expert_weights, random_expert
from specter_models.specter_model import SpecterModel


def _set_experts_implementation(
    model: PreTrainedModel, dtype: torch.dtype, experts_implementation: str | None
) -> None:
    # transformers' default grouped_mm has no float64 kernel; its eager loop does.
    if experts_implementation is None and dtype == torch.float64:
        experts_implementation = "eager"
    if experts_implementation is not None:
        model.set_experts_implementation(experts_implementation)


def build_reference_model(
    preset: str,
    *,
    seed: int = 0,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float16,
    experts_implementation: str | None = None,
) -> PreTrainedModel:
    """transformers' own model of a preset, every weight resident, from the preset's seed.

    Args:
        preset: a preset name (see ``specter_models.PRESETS``).
        seed: the random-weight seed (as given to ``load``).
        device: where to build (the same device as the engine gives the same values).
        dtype: the weights' dtype.
        experts_implementation: transformers' experts implementation (``"eager"``,
            ``"batched_mm"``, ``"grouped_mm"``); default: transformers' default, or eager for
            float64.

    Returns:
        The model in eval mode.

    Raises:
        KeyError: an unknown preset.
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    config = get_preset(preset).make_config()
    arch = architecture_for(config)
    model = build_on_meta(arch, config, dtype)
    materialize(model, device)
    layers = find_moe_layers(model)
    std = float(getattr(config, "initializer_range", 0.02))
    routed = {
        f"model.layers.{layer.decoder_layer}.mlp.experts.{name}"
        for layer in layers
        for name in ("gate_up_proj", "down_proj")
    }
    init_non_expert_weights(model, seed=seed, std=std, skip=tuple(routed))
    with torch.no_grad():
        for layer in layers:
            for e in range(layer.num_experts):
                tensors = random_expert(layer, e, seed=seed, std=std, device=device, dtype=dtype)
                layer.block.experts.gate_up_proj[e].copy_(tensors["gate_up"])
                layer.block.experts.down_proj[e].copy_(tensors["down"])
    _set_experts_implementation(model, dtype, experts_implementation)
    return model


def reference_model_from(
    loaded: SpecterModel, *, experts_implementation: str | None = None
) -> PreTrainedModel:
    """transformers' own model with a loaded Specter model's exact weights, all resident.

    Non-expert parameters are copied on the device; routed experts come from the host store
    one at a time (never two copies of all experts on the device).

    Args:
        loaded: a ``SpecterModel``.
        experts_implementation: as in ``build_reference_model``.

    Returns:
        The model in eval mode, on ``loaded``'s device and dtype.
    """
    config = copy.deepcopy(loaded.config)
    dtype = next(loaded.model.parameters()).dtype
    model = build_on_meta(loaded.architecture, config, dtype)
    materialize(model, loaded.device)
    source = dict(loaded.model.named_parameters())
    store = loaded.cache.store
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".mlp.experts." not in name:
                param.copy_(source[name])
        for layer in find_moe_layers(model):
            for e in range(layer.num_experts):
                tensors = store.get(layer.index, e)
                layer.block.experts.gate_up_proj[e].copy_(tensors["gate_up"])
                layer.block.experts.down_proj[e].copy_(tensors["down"])
    _set_experts_implementation(model, dtype, experts_implementation)
    return model
