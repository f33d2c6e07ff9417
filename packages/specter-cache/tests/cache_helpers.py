"""Helpers shared by specter-cache's tests (importable: conftest puts tests/ on sys.path)."""

from __future__ import annotations

import torch

from specter_cache import ExpertLayout, ExpertStore


def random_expert(layout: ExpertLayout, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Fresh random tensors matching ``layout``."""
    out = {}
    for name, spec in layout.specs.items():
        if spec.dtype.is_floating_point:
            out[name] = torch.randn(spec.shape, generator=generator).to(spec.dtype)
        else:
            out[name] = torch.randint(-1000, 1000, spec.shape, generator=generator).to(spec.dtype)
    return out


def build_store(
    num_layers: int,
    num_experts: int,
    layout: ExpertLayout | None = None,
    seed: int = 0,
    **store_kwargs,
) -> tuple[ExpertStore, dict[tuple[int, int], dict[str, torch.Tensor]]]:
    """A store filled with random experts, plus an independent copy of what was put."""
    if layout is None:
        layout = ExpertLayout({"gate_up": ((6, 4), torch.float16), "down": ((4, 3), torch.float16)})
    g = torch.Generator().manual_seed(seed)
    store = ExpertStore(num_layers, num_experts, layout, **store_kwargs)
    reference = {}
    for layer in range(num_layers):
        for e in range(num_experts):
            tensors = random_expert(layout, g)
            store.put(layer, e, tensors)
            reference[(layer, e)] = {k: v.clone() for k, v in tensors.items()}
    return store, reference
