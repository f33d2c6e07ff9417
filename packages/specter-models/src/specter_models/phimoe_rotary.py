"""PhiMoE's rotary embedding without a host-to-device copy per forward.

transformers 5.17's ``PhimoeRotaryEmbedding.forward`` recomputes its inverse frequencies on
the CPU at every call and copies them to the device: a synchronous copy on every decode
step (found by the draft-step sync check on an H200). For plain RoPE the frequencies never
change, so ``StaticPhimoeRotaryEmbedding`` computes them once, exactly as that forward does
(same function, on the CPU), keeps them on the device, and then runs the same arithmetic.
``longrope`` (whose scale depends on the sequence length) keeps transformers' module.
"""

from __future__ import annotations

import torch
from transformers.models.phimoe.modeling_phimoe import PhimoeRotaryEmbedding


class StaticPhimoeRotaryEmbedding(PhimoeRotaryEmbedding):
    """``PhimoeRotaryEmbedding`` for ``rope_type == "default"`` with frequencies cached.

    Args:
        config: the PhiMoE config (plain RoPE).
        device: where the cached frequencies live.

    Raises:
        ValueError: the config uses another RoPE type.
    """

    def __init__(self, config, device: torch.device | str):
        if config.rope_parameters["rope_type"] != "default":
            raise ValueError(
                "StaticPhimoeRotaryEmbedding handles plain RoPE only, got rope_type="
                f"{config.rope_parameters['rope_type']!r}"
            )
        with torch.device(device):
            super().__init__(config)
        inv_freq, scaling = self.rope_init_fn(self.config)  # what forward would compute, once
        # A non-persistent buffer: kept out of state dicts, moved with the module.
        self.static_inv_freq = torch.nn.Buffer(
            inv_freq.to(dtype=torch.float, device=device), persistent=False
        )
        self.static_scaling = scaling

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor):
        """``(cos, sin)`` ``[B, T, head_dim]`` for ``position_ids [B, T]``, as transformers'."""
        inv_freq = self.static_inv_freq[None, :, None].expand(position_ids.shape[0], -1, 1)
        positions = position_ids[:, None, :].float()
        freqs = (inv_freq @ positions).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = emb.cos() * self.static_scaling
        sin = emb.sin() * self.static_scaling
        return cos.to(x.dtype), sin.to(x.dtype)
