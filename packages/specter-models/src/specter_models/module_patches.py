"""Replacing the forward of some of a model's modules, once each.

Specter's fusions (``fused_norms``, ``fused_rotary``, ``fused_routers``, ``absorbed_mla``,
``fused_mlp``) each swap the ``forward`` of the transformers modules they recognise for one
of their own, mark the module, and skip marked modules on a second install, so installing
twice wraps nothing twice. :func:`patch_forwards` is that loop. The fusions that run one
GEMM for several linears (``fused_mlp``, ``fused_projections``) concatenate their weights with
:func:`concatenate_linear_weights`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

Forward = Callable[..., Any]


def patch_forwards(
    model: nn.Module,
    applies: Callable[[nn.Module], bool],
    marker: str,
    make_forward: Callable[[nn.Module, Forward], Forward],
) -> int:
    """Give every module of ``model`` that ``applies`` and is not yet marked the forward
    ``make_forward(module, its current forward)``, and mark it.

    Args:
        model: the module tree to walk (``model.modules()`` order).
        applies: which modules the patch is for.
        marker: the attribute set to True on a patched module (and checked first).
        make_forward: builds the new forward from the module and the forward it replaces.

    Returns:
        How many modules were patched by this call (0 when all were already).
    """
    count = 0
    for module in model.modules():
        if getattr(module, marker, False) or not applies(module):
            continue
        module.forward = make_forward(module, module.forward)
        setattr(module, marker, True)
        count += 1
    return count


@torch.no_grad()
def concatenate_linear_weights(module: nn.Module, names: tuple[str, ...], installer: str):
    """``[sum of N, K]``: the weights of ``module``'s linears ``names`` (each ``[N_i, K]``,
    one K, dtype and device) stacked in that order in one new tensor; each linear's weight
    becomes a frozen view of its rows, so no weight is held twice and ``state_dict`` keeps its
    names and values.

    Raises:
        ValueError: a weight is still on the meta device (``installer``, the caller, copies
            real weights, so it must run after they are loaded).
    """
    linears = [getattr(module, name) for name in names]
    first = linears[0].weight
    if any(linear.weight.is_meta for linear in linears):
        raise ValueError(
            f"{type(module).__name__}.{names[0]}.weight {tuple(first.shape)} is on the meta "
            f"device: {installer} copies real weights, so call it after the weights are "
            "loaded (load_non_expert_weights or init_non_expert_weights)"
        )
    rows = [linear.weight.shape[0] for linear in linears]
    fused = torch.empty(sum(rows), first.shape[1], dtype=first.dtype, device=first.device)
    for linear, part in zip(linears, fused.split(rows), strict=True):
        part.copy_(linear.weight)
        linear.weight = nn.Parameter(part, requires_grad=False)
    return fused
