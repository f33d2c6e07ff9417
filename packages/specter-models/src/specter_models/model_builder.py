"""Building transformers' own model object without ever allocating its routed experts.

The model class is instantiated on the ``meta`` device (no memory), its routed-experts
modules are swapped for ``SpecterExperts`` (which own no FP16 weights), and only then is it
materialised on the target device: embeddings, attention, norms, routers, shared experts and
the LM head get real (uninitialised) storage, to be filled from a checkpoint or seeded
random weights. Rotary embeddings, whose buffers are computed at construction, are rebuilt
on the device. The same steps without the swap build the plain reference model.
"""

from __future__ import annotations

import torch
from transformers import PretrainedConfig, PreTrainedModel
from transformers.models.phimoe.modeling_phimoe import PhimoeRotaryEmbedding

from specter_models.architecture import Architecture, find_moe_layers
from specter_models.experts_runtime import ExpertsRuntime
from specter_models.phimoe_rotary import StaticPhimoeRotaryEmbedding
from specter_models.specter_experts import SpecterExperts


def build_on_meta(
    arch: Architecture, config: PretrainedConfig, dtype: torch.dtype
) -> PreTrainedModel:
    """transformers' model for ``config`` on the meta device, in ``dtype``, in eval mode."""
    with torch.device("meta"):
        model = arch.model_class(config)
    model.to(dtype)
    model.eval()
    model.requires_grad_(False)
    return model


def swap_routed_experts(model: PreTrainedModel, runtime: ExpertsRuntime) -> list[SpecterExperts]:
    """Replace every MoE block's ``experts`` module with a ``SpecterExperts``.

    Returns:
        The new modules, one per MoE layer, in layer order.
    """
    swapped = []
    for layer in find_moe_layers(model):
        module = SpecterExperts(
            runtime,
            layer.index,
            layer.num_experts,
            layer.hidden_size,
            layer.intermediate_size,
        )
        layer.block.experts = module
        swapped.append(module)
    return swapped


def materialize(
    model: PreTrainedModel, device: torch.device | str, *, sync_free_rotary: bool = False
) -> list[str]:
    """Give every parameter storage on ``device`` (uninitialised) and rebuild rotary buffers.

    Args:
        model: a model built by ``build_on_meta``.
        device: where its parameters go.
        sync_free_rotary: replace PhiMoE's plain-RoPE embedding with
            ``StaticPhimoeRotaryEmbedding`` (same values, no per-forward host-to-device copy).
            Specter's engine sets it; reference models keep transformers' module.

    Returns:
        Parameter names a checkpoint need not hold because they are tied (the LM head when
        ``tie_word_embeddings``).

    Raises:
        RuntimeError: a buffer other than a rotary embedding's, which this function cannot
            recompute.
    """
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        # "cuda" and "cuda:0" compare unequal; buffers report an indexed device.
        device = torch.device("cuda", torch.cuda.current_device())
    model.to_empty(device=device)
    for parent in list(model.modules()):
        for child_name, child in list(parent.named_children()):
            if hasattr(child, "inv_freq") and hasattr(child, "rope_type"):
                # Construction computes inv_freq (float32) from the config; on meta it was lost.
                if (
                    sync_free_rotary
                    and isinstance(child, PhimoeRotaryEmbedding)
                    and (child.rope_type == "default")
                ):
                    rotary = StaticPhimoeRotaryEmbedding(child.config, device)
                else:
                    with torch.device(device):
                        rotary = type(child)(config=child.config)
                setattr(parent, child_name, rotary)
    for name, buffer in model.named_buffers():
        if "rotary_emb" not in name or buffer.device != device:
            raise RuntimeError(
                f"materialize: buffer {name} cannot be recomputed on {device}; this model "
                "layout is not supported"
            )
    tied: list[str] = []
    config = model.config.get_text_config(decoder=True)
    if getattr(config, "tie_word_embeddings", False):
        model.lm_head.weight = model.model.embed_tokens.weight
        tied.append("lm_head.weight")
    return tied
