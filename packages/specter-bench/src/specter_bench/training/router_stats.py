"""Router observation during training: the load-balance term and expert-usage entropy.

Forward hooks on each MoE layer's router read the routers' own outputs
`(router_logits [T, E], top_k_weights [T, K], top_k_index [T, K])`, which DeepSeek-V2,
Qwen2-MoE and PhiMoE routers all return in transformers 5. Nothing in the models' code
changes: routing is exactly transformers' routing.

The balance term is the expert-level loss of Switch Transformer and DeepSeek-V2,
`E * sum_i f_i * P_i` per layer (f_i: share of the layer's top-k selections that went to
expert i, P_i: expert i's mean router probability), averaged over MoE layers; it equals 1
when routing is uniform. Usage entropy is the entropy of f over log(E): 1 is perfectly
balanced, near 0 is collapsed routing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class MoeRouter:
    """One MoE layer's router.

    Attributes:
        layer_index: The decoder layer it sits in.
        module: The router module (its forward returns logits, weights, indices).
        num_experts: Routed experts E.
        top_k: Experts chosen per token K.
    """

    layer_index: int
    module: nn.Module
    num_experts: int
    top_k: int


def find_moe_routers(model: nn.Module) -> list[MoeRouter]:
    """Finds the router of every MoE decoder layer.

    Args:
        model: A transformers causal LM with `model.model.layers[i].mlp`.

    Returns:
        Routers in layer order (dense layers have none).

    Raises:
        ValueError: If the model has no MoE layer of a recognised type.
    """
    routers = []
    for index, layer in enumerate(model.model.layers):
        mlp = layer.mlp
        if not hasattr(mlp, "experts"):
            continue  # a dense layer, e.g. DeepSeek-V2's first_k_dense_replace layers
        module = mlp.router if hasattr(mlp, "router") else getattr(mlp, "gate", None)
        if module is None:
            raise ValueError(f"layer {index}: MoE block {type(mlp).__name__} has no router.")
        routers.append(MoeRouter(index, module, int(module.num_experts), int(module.top_k)))
    if not routers:
        raise ValueError(f"{type(model).__name__} has no MoE layer with a router.")
    return routers


class RouterMonitor:
    """Records routing through forward hooks on every router.

    Args:
        routers: From `find_moe_routers`.

    Use `collect_logits` while training to get the balance term of the last forward, and
    `count_usage` to accumulate per-layer expert loads (device tensors, read by `usage`).
    """

    def __init__(self, routers: list[MoeRouter]):
        self.routers = routers
        self.collect_logits = False
        self.count_usage = False
        self._captured: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._loads: list[torch.Tensor | None] = [None] * len(routers)
        self._handles = [
            router.module.register_forward_hook(self._make_hook(slot))
            for slot, router in enumerate(routers)
        ]

    def _make_hook(self, slot: int):
        router = self.routers[slot]

        def hook(module: nn.Module, args: tuple, output: tuple) -> None:
            router_logits, _, top_k_index = output
            if self.collect_logits:
                self._captured.append((router_logits, top_k_index))
            if self.count_usage:
                load = self._loads[slot]
                if load is None:
                    load = torch.zeros(
                        router.num_experts, dtype=torch.float64, device=top_k_index.device
                    )
                    self._loads[slot] = load
                # index_add_ keeps the count on the device: no host sync per layer.
                flat = top_k_index.reshape(-1)
                load.index_add_(0, flat, torch.ones_like(flat, dtype=torch.float64))

        return hook

    def balance_loss(self) -> torch.Tensor | None:
        """The mean expert-level balance term over the last forward's MoE layers.

        Returns:
            A scalar tensor (1.0 for uniform routing), or None if nothing was captured.
        """
        if not self._captured:
            return None
        terms = []
        for (router_logits, top_k_index), router in zip(self._captured, self.routers, strict=True):
            probs = router_logits.float().softmax(dim=-1)  # [T, E]
            flat = top_k_index.reshape(-1)
            selections = torch.zeros(router.num_experts, device=flat.device, dtype=probs.dtype)
            selections.index_add_(0, flat, torch.ones_like(flat, dtype=probs.dtype))
            share = selections / flat.numel()  # f_i / E in the paper's notation: sums to 1
            terms.append(router.num_experts * (share * probs.mean(dim=0)).sum())
        self._captured.clear()
        return torch.stack(terms).mean()

    def clear(self) -> None:
        """Drops captured router outputs (e.g. after a forward that needs no balance term)."""
        self._captured.clear()

    def usage(self) -> list[dict]:
        """Per-layer expert usage since the last reset; reads the counts back (one sync).

        Returns:
            One dict per MoE layer: layer, entropy (normalised to [0, 1]), max_load (the
            busiest expert's share times E; 1.0 is balanced), unused_experts.
        """
        report = []
        for router, load in zip(self.routers, self._loads, strict=True):
            if load is None:
                continue
            counts = load.cpu()  # host sync: once per evaluation, not per step
            total = float(counts.sum())
            share = counts / max(total, 1.0)
            nonzero = share[share > 0]
            entropy = float(-(nonzero * nonzero.log()).sum()) / math.log(router.num_experts)
            report.append(
                {
                    "layer": router.layer_index,
                    "entropy": round(entropy, 4),
                    "max_load": round(float(share.max()) * router.num_experts, 3),
                    "unused_experts": int((counts == 0).sum()),
                }
            )
        return report

    def reset_usage(self) -> None:
        """Zeroes the accumulated expert loads."""
        self._loads = [None] * len(self.routers)

    def remove(self) -> None:
        """Removes the hooks."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._captured.clear()
