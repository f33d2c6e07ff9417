"""What differs between the supported model types: names, KV shapes and limits.

Specter runs transformers' own model classes and swaps only their routed-experts modules, so
an architecture is a small table: the model class, where a checkpoint keeps each routed
expert's projections (the original per-expert names that ``save_pretrained`` writes back),
which non-expert keys transformers renames on load (transformers 5.17
``conversion_mapping.py``), and the shape of one KV-cache row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import transformers
from transformers import PretrainedConfig

SUPPORTED_MODEL_TYPES = ("deepseek_v2", "qwen2_moe", "phimoe")


@dataclass(frozen=True)
class Architecture:
    """Per-model-type facts Specter needs beyond transformers' own modeling code.

    Attributes:
        model_type: transformers' ``config.model_type``.
        model_class_name: the causal-LM class in ``transformers``.
        expert_prefix: checkpoint prefix of one routed expert, formatted with ``layer`` (the
            decoder layer) and ``expert``.
        gate_name: the gate projection's key suffix (SiLU input).
        up_name: the up projection's key suffix.
        down_name: the down projection's key suffix.
        key_renames: ``(old, new)`` substring renames applied to non-expert checkpoint keys,
            in order, to get transformers' parameter names.
        mla: whether attention caches DeepSeek's compressed latents (MLA).
    """

    model_type: str
    model_class_name: str
    expert_prefix: str
    gate_name: str
    up_name: str
    down_name: str
    key_renames: tuple[tuple[str, str], ...] = ()
    mla: bool = False

    @property
    def model_class(self) -> type:
        """The transformers causal-LM class."""
        return getattr(transformers, self.model_class_name)

    def expert_keys(self, layer: int, expert: int) -> dict[str, str]:
        """Checkpoint keys of one routed expert: ``{"gate", "up", "down"} -> key``."""
        prefix = self.expert_prefix.format(layer=layer, expert=expert)
        return {
            "gate": prefix + self.gate_name,
            "up": prefix + self.up_name,
            "down": prefix + self.down_name,
        }

    def fused_expert_keys(self, layer: int) -> dict[str, str]:
        """Keys of transformers' in-memory stacked layout (``[E, 2I, H]`` and ``[E, H, I]``).

        ``save_pretrained`` writes the per-expert names, but other tools may save the
        stacked tensors as they are in memory; both load.
        """
        prefix = f"model.layers.{layer}.mlp.experts."
        return {"gate_up": prefix + "gate_up_proj", "down": prefix + "down_proj"}

    def is_expert_key(self, key: str) -> bool:
        """Whether ``key`` holds a routed expert's weight (either layout)."""
        marker = self.expert_prefix.split("{layer}")[1].split("{expert}")[0]  # ".mlp.experts."
        return marker in key or ".mlp.experts." in key

    def model_key(self, checkpoint_key: str) -> str:
        """transformers' parameter name for a non-expert checkpoint key."""
        for old, new in self.key_renames:
            checkpoint_key = checkpoint_key.replace(old, new)
        return checkpoint_key

    def kv_row_shapes(self, config: PretrainedConfig) -> tuple[tuple[int, int], tuple[int, int]]:
        """``((key_heads, key_dim), (value_heads, value_dim))`` of one cached position.

        DeepSeek-V2 caches its compressed latents through the Cache's ``update``: the normed
        ``kv_lora_rank`` latent as "keys" and the rotary key part as "values", one head each.
        """
        if self.mla:
            return (1, config.kv_lora_rank), (1, config.qk_rope_head_dim)
        head_dim = getattr(config, "head_dim", None) or (
            config.hidden_size // config.num_attention_heads
        )
        return (config.num_key_value_heads, head_dim), (config.num_key_value_heads, head_dim)

    def check_config(self, config: PretrainedConfig, max_seq_len: int) -> None:
        """Refuse configurations the engine cannot run exactly.

        Raises:
            ValueError: a non-SiLU expert activation (the fused kernels compute SiLU), or a
                sliding attention window shorter than ``max_seq_len`` (a window drops KV
                rows that speculative rollback would need).
        """
        if getattr(config, "hidden_act", "silu") != "silu":
            raise ValueError(
                f"{self.model_type}: hidden_act={config.hidden_act!r}, but Specter's expert "
                "kernels compute SiLU-gated experts; only hidden_act='silu' is supported"
            )
        window = _sliding_window(config)
        if window is not None and window < max_seq_len:
            raise ValueError(
                f"{self.model_type}: sliding_window={window} is shorter than "
                f"max_seq_len={max_seq_len}; sliding-window KV cannot be rolled back. Use "
                f"max_seq_len <= {window}."
            )


def _sliding_window(config: PretrainedConfig) -> int | None:
    if config.model_type == "qwen2_moe":
        layer_types = getattr(config, "layer_types", None) or []
        return config.sliding_window if "sliding_attention" in layer_types else None
    return getattr(config, "sliding_window", None)


ARCHITECTURES: dict[str, Architecture] = {
    "deepseek_v2": Architecture(
        model_type="deepseek_v2",
        model_class_name="DeepseekV2ForCausalLM",
        expert_prefix="model.layers.{layer}.mlp.experts.{expert}.",
        gate_name="gate_proj.weight",
        up_name="up_proj.weight",
        down_name="down_proj.weight",
        mla=True,
    ),
    "qwen2_moe": Architecture(
        model_type="qwen2_moe",
        model_class_name="Qwen2MoeForCausalLM",
        expert_prefix="model.layers.{layer}.mlp.experts.{expert}.",
        gate_name="gate_proj.weight",
        up_name="up_proj.weight",
        down_name="down_proj.weight",
    ),
    # Phi-3.5-MoE checkpoints keep Mixtral's names: w1 = gate, w3 = up, w2 = down, under
    # `block_sparse_moe`, whose router is `gate`; transformers renames both on load.
    "phimoe": Architecture(
        model_type="phimoe",
        model_class_name="PhimoeForCausalLM",
        expert_prefix="model.layers.{layer}.block_sparse_moe.experts.{expert}.",
        gate_name="w1.weight",
        up_name="w3.weight",
        down_name="w2.weight",
        key_renames=((".block_sparse_moe.", ".mlp."), (".mlp.gate.weight", ".mlp.router.weight")),
    ),
}


def architecture_for(config_or_type: PretrainedConfig | str) -> Architecture:
    """The architecture of a config (or a ``model_type`` string).

    Raises:
        ValueError: the model type is not one of deepseek_v2, qwen2_moe, phimoe.
    """
    model_type = config_or_type if isinstance(config_or_type, str) else config_or_type.model_type
    arch = ARCHITECTURES.get(model_type)
    if arch is None:
        raise ValueError(
            f"model_type {model_type!r} is not supported by specter-models; supported model "
            f"types: {', '.join(SUPPORTED_MODEL_TYPES)} (DeepSeek-V2, Qwen2-MoE / Qwen1.5-MoE, "
            "Phi-3.5-MoE)"
        )
    return arch


@dataclass(frozen=True)
class MoeLayer:
    """One MoE decoder layer of a built model.

    Attributes:
        index: position among the MoE layers (the expert cache's layer index).
        decoder_layer: the decoder layer's index in ``model.model.layers``.
        block: the MoE block (``layer.mlp``): router, shared experts, routed experts.
        num_experts: routed experts ``E``.
        hidden_size: ``H``.
        intermediate_size: ``I`` of one routed expert.
    """

    index: int
    decoder_layer: int
    block: torch.nn.Module
    num_experts: int
    hidden_size: int
    intermediate_size: int


def find_moe_layers(model: torch.nn.Module) -> list[MoeLayer]:
    """The MoE layers of a transformers causal LM, in decoder order.

    A decoder layer is an MoE layer when its ``mlp`` has an ``experts`` module (DeepSeek's
    dense first layers and Qwen's MLP-only layers have none).

    Raises:
        ValueError: the model has no MoE layer.
    """
    layers: list[MoeLayer] = []
    for d, decoder_layer in enumerate(model.model.layers):
        experts = getattr(decoder_layer.mlp, "experts", None)
        if experts is None:
            continue
        layers.append(
            MoeLayer(
                index=len(layers),
                decoder_layer=d,
                block=decoder_layer.mlp,
                num_experts=experts.num_experts,
                hidden_size=experts.hidden_dim,
                intermediate_size=experts.intermediate_dim,
            )
        )
    if not layers:
        raise ValueError(f"{type(model).__name__} has no MoE layer (no mlp.experts module)")
    return layers
