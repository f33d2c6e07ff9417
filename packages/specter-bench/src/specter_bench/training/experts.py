"""A grouped-GEMM experts forward for training under bf16 autocast, and how one is chosen.

transformers' `grouped_mm` experts path casts activations to the weights' dtype; with fp32
master weights under bf16 autocast that asks `torch.nn.functional.grouped_mm` for fp32
operands, which its CUDA kernel does not promise. This forward casts both operands to the
autocast dtype (bf16 on CUDA, fp32 on CPU) so gradients still reach the fp32 weights, and
keeps every step on the device (no host sync). It is registered under its own name in
transformers' experts interface and used only while training; the saved config does not
name it. `choose_experts_implementation` checks it against transformers' eager loop on a
real batch and falls back to eager when it fails or disagrees.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

TRAIN_GROUPED = "specter_train_grouped_mm"


def _compute_dtype(reference: torch.Tensor) -> torch.dtype:
    device_type = reference.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return reference.dtype


def train_grouped_experts_forward(
    self: nn.Module,
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
) -> torch.Tensor:
    """Routed experts as two grouped GEMMs over tokens sorted by expert.

    Args:
        self: A transformers experts module with `gate_up_proj [E, 2I, H]` and
            `down_proj [E, H, I]` (concatenated gate/up, not transposed, no bias).
        hidden_states: Tokens `[T, H]`.
        top_k_index: Chosen experts `[T, K]`.
        top_k_weights: Their routing weights `[T, K]`.

    Returns:
        The weighted sum of each token's experts `[T, H]`, in hidden_states' dtype.

    Raises:
        ValueError: If the module's weight layout is not the one described above.
    """
    if getattr(self, "has_bias", False) or getattr(self, "is_transposed", False):
        raise ValueError(
            f"{type(self).__name__} stores biased or transposed experts; use "
            "--experts-impl eager for this architecture."
        )
    num_tokens, hidden = hidden_states.shape
    top_k = top_k_index.shape[-1]
    dtype = _compute_dtype(hidden_states)
    flat_experts = top_k_index.reshape(-1)  # [T*K]
    order = torch.argsort(flat_experts, stable=True)  # slots grouped by expert
    token_of_slot = order // top_k
    tokens_per_expert = torch.zeros(
        self.num_experts, dtype=torch.int32, device=hidden_states.device
    ).index_add_(0, flat_experts, torch.ones_like(flat_experts, dtype=torch.int32))
    offsets = torch.cumsum(tokens_per_expert, dim=0, dtype=torch.int32)  # [E]

    inputs = hidden_states[token_of_slot].to(dtype)  # [T*K, H]
    gate_up = F.grouped_mm(inputs, self.gate_up_proj.to(dtype).transpose(-2, -1), offs=offsets)
    activated = self._apply_gate(gate_up)  # [T*K, I]
    outputs = F.grouped_mm(activated, self.down_proj.to(dtype).transpose(-2, -1), offs=offsets)
    weights = top_k_weights.reshape(-1)[order].unsqueeze(-1)  # [T*K, 1]
    weighted = outputs.float() * weights.float()
    combined = torch.zeros(num_tokens, hidden, dtype=torch.float32, device=hidden_states.device)
    combined.index_add_(0, token_of_slot, weighted)
    return combined.to(hidden_states.dtype)


ALL_EXPERTS_FUNCTIONS.register(TRAIN_GROUPED, train_grouped_experts_forward)


def choose_experts_implementation(
    model: nn.Module,
    loss_fn: Callable[[nn.Module], torch.Tensor],
    requested: str,
    log: Callable[[str], None],
) -> dict:
    """Picks the experts implementation used for training.

    With "auto", the grouped forward is kept only if a forward and backward through it
    succeed and match transformers' eager loop (loss within 0.02 + 0.5 %, expert-weight
    gradients within 5 % relative L2); otherwise eager is used. The model is left with
    zero gradients and the chosen implementation set.

    Args:
        model: The model to train.
        loss_fn: Computes a scalar loss on a fixed probe batch (deterministic: the model is
            put in eval mode for the probe).
        requested: "auto", "eager" or TRAIN_GROUPED.
        log: Where to report the outcome.

    Returns:
        {"experts_implementation": name, "probe": details}.

    Raises:
        ValueError: If requested is not one of the accepted names.
    """
    accepted = ("auto", "eager", TRAIN_GROUPED)
    if requested not in accepted:
        raise ValueError(f"--experts-impl {requested!r} is not one of {accepted}.")
    if requested != "auto":
        model.set_experts_implementation(requested)
        return {"experts_implementation": requested, "probe": "skipped (requested explicitly)"}

    expert_weight = next(p for n, p in model.named_parameters() if n.endswith("gate_up_proj"))
    was_training = model.training
    model.eval()  # no routing noise (PhiMoE jitter), so both runs see identical routing
    results = {}
    try:
        for name in ("eager", TRAIN_GROUPED):
            model.zero_grad(set_to_none=True)
            model.set_experts_implementation(name)
            try:
                loss = loss_fn(model)
                loss.backward()
                grad = expert_weight.grad.detach().float().clone()
                results[name] = {"loss": float(loss.detach()), "grad": grad}
            except (RuntimeError, NotImplementedError, ValueError) as error:
                results[name] = {"error": f"{type(error).__name__}: {error}"}
    finally:
        model.zero_grad(set_to_none=True)
        model.train(was_training)

    eager, grouped = results["eager"], results[TRAIN_GROUPED]
    if "error" in eager:
        raise RuntimeError(f"the eager experts loop failed on the probe batch: {eager['error']}")
    if not torch.isfinite(eager["grad"]).all():
        raise RuntimeError(
            "transformers' eager experts loop gives non-finite expert gradients on the probe "
            "batch: the model itself is broken at initialisation, not the grouped forward."
        )
    probe = {"eager_loss": round(eager["loss"], 5)}
    chosen = "eager"
    if "error" in grouped:
        probe["grouped_error"] = grouped["error"]
    else:
        loss_gap = abs(grouped["loss"] - eager["loss"])
        grad_gap = float(
            (grouped["grad"] - eager["grad"]).norm() / eager["grad"].norm().clamp_min(1e-12)
        )
        probe.update(
            grouped_loss=round(grouped["loss"], 5),
            loss_gap=round(loss_gap, 6),
            grad_rel_gap=round(grad_gap, 6),
        )
        if loss_gap <= 0.02 + 0.005 * abs(eager["loss"]) and grad_gap <= 0.05:
            chosen = TRAIN_GROUPED
    model.set_experts_implementation(chosen)
    log(f"experts implementation: {chosen} ({probe})")
    return {"experts_implementation": chosen, "probe": probe}
