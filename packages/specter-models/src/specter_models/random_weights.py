"""Seeded random weights for the presets, reproducible tensor by tensor.

Every tensor draws from its own generator, seeded from ``(seed, tensor name)``, on the device
it is made on. So one routed expert can be made alone (and go straight into pinned host
memory) and come out identical to the same expert inside a plain transformers model built
with the same seed on the same device: the engine and the ``hf`` reference share weights
without ever holding all experts on the device.

The distributions follow transformers' ``_init_weights``: matrices (linears, embeddings,
routers, experts) ``normal(0, initializer_range)``, norm scales one, biases zero, an
embedding's padding row zero.
"""

from __future__ import annotations

import hashlib

import torch
from torch import nn

from specter_models.architecture import MoeLayer


def tensor_seed(seed: int, name: str) -> int:
    """A 63-bit generator seed for tensor ``name`` under the model seed ``seed``."""
    digest = hashlib.sha256(f"{seed}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def seeded_normal(
    name: str,
    shape: tuple[int, ...],
    std: float,
    seed: int,
    device: torch.device | str,
    dtype: torch.dtype,
) -> torch.Tensor:
    """``normal(0, std)`` tensor of ``shape`` from the generator of ``(seed, name)``.

    Drawn in float32 on ``device`` (so a CUDA and a CPU build differ, but two builds on one
    device agree), then cast to ``dtype``.
    """
    device = torch.device(device)
    generator = torch.Generator(device=device)
    generator.manual_seed(tensor_seed(seed, name))
    values = torch.randn(shape, generator=generator, device=device, dtype=torch.float32)
    return values.mul_(std).to(dtype)


def expert_tensor_names(layer: MoeLayer, expert: int) -> dict[str, str]:
    """The names seeding one routed expert's ``gate_up`` and ``down``."""
    prefix = f"model.layers.{layer.decoder_layer}.mlp.experts.{expert}."
    return {"gate_up": prefix + "gate_up_proj", "down": prefix + "down_proj"}


def random_expert(
    layer: MoeLayer,
    expert: int,
    *,
    seed: int,
    std: float,
    device: torch.device | str,
    dtype: torch.dtype,
) -> dict[str, torch.Tensor]:
    """One routed expert: ``{"gate_up": [2I, H], "down": [H, I]}``."""
    H, I = layer.hidden_size, layer.intermediate_size
    names = expert_tensor_names(layer, expert)
    return {
        "gate_up": seeded_normal(names["gate_up"], (2 * I, H), std, seed, device, dtype),
        "down": seeded_normal(names["down"], (H, I), std, seed, device, dtype),
    }


def init_non_expert_weights(
    model: nn.Module, *, seed: int, std: float, skip: tuple[str, ...] = ()
) -> None:
    """Fill every parameter of ``model`` except those in ``skip``, in place.

    Routed experts are not parameters of a Specter model; in a plain transformers model,
    pass their names in ``skip`` and fill them with ``random_expert``.

    Raises:
        ValueError: a one-dimensional parameter that is neither a bias nor a norm scale
            (a layout this function does not know how to initialise).
    """
    modules = dict(model.named_modules())
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name in skip:
                continue
            owner = modules[name.rpartition(".")[0]]
            param.copy_(
                random_parameter(
                    name,
                    tuple(param.shape),
                    owner,
                    seed=seed,
                    std=std,
                    device=param.device,
                    dtype=param.dtype,
                )
            )


def random_parameter(
    name: str,
    shape: tuple[int, ...],
    owner: nn.Module,
    *,
    seed: int,
    std: float,
    device: torch.device | str,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The seeded value of one non-expert parameter, as ``init_non_expert_weights`` sets it.

    Args:
        name: the parameter's name in the model (it seeds the generator).
        shape: its shape.
        owner: the module holding it (an embedding's padding row, a norm's scale).
        seed, std, device, dtype: as ``seeded_normal``.

    Returns:
        Matrices ``normal(0, std)`` (an embedding's padding row zero), norm scales one,
        biases zero.

    Raises:
        ValueError: a one-dimensional parameter that is neither a bias nor a norm scale.
    """
    leaf = name.rpartition(".")[2]
    if len(shape) >= 2:
        values = seeded_normal(name, shape, std, seed, device, dtype)
        padding = getattr(owner, "padding_idx", None)
        if isinstance(owner, nn.Embedding) and padding is not None:
            values[padding].zero_()
        return values
    if leaf == "bias":
        return torch.zeros(shape, device=device, dtype=dtype)
    if leaf == "weight" and _is_norm(owner):
        return torch.ones(shape, device=device, dtype=dtype)
    raise ValueError(
        f"init_non_expert_weights: no rule for {name} {shape} in {type(owner).__name__}"
    )


def _is_norm(module: nn.Module) -> bool:
    return isinstance(module, nn.LayerNorm) or type(module).__name__.endswith("RMSNorm")
