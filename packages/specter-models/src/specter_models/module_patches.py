"""Replacing the forward of some of a model's modules, once each.

Specter's fusions (``fused_norms``, ``fused_rotary``, ``fused_routers``, ``absorbed_mla``,
``fused_mlp``) each swap the ``forward`` of the transformers modules they recognise for one
of their own, mark the module, and skip marked modules on a second install, so installing
twice wraps nothing twice. :func:`patch_forwards` is that loop.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

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
