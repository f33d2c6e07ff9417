"""Where a model's values first stop being finite: the error path of non-finite logits."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["first_non_finite_layer"]


def _output(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, tuple | list) and value and isinstance(value[0], torch.Tensor):
        return value[0]
    return None


@torch.no_grad()
def first_non_finite_layer(loaded: Any, prompt_ids: list[int]) -> str | None:
    """Run the target once on ``prompt_ids`` and name the first module whose output holds a
    NaN or an infinity: ``"the embedding"``, ``"decoder layer i"`` or ``"the final norm"``.

    Meant for the error path (it reads every layer's output on the host); the model is
    reset afterwards.

    Args:
        loaded: the ``SpecterModel``.
        prompt_ids: the tokens to run (``[T]``).

    Returns:
        The module's name, or None where every output is finite.
    """
    inner = loaded.model.model
    named = [("the embedding", inner.embed_tokens)]
    named += [(f"decoder layer {i}", layer) for i, layer in enumerate(inner.layers)]
    named.append(("the final norm", inner.norm))
    found: list[str] = []

    def hook(name: str):
        def check(_module: Any, _args: Any, output: Any) -> None:
            tensor = _output(output)
            if not found and tensor is not None and not bool(torch.isfinite(tensor).all()):
                found.append(name)

        return check

    handles = [module.register_forward_hook(hook(name)) for name, module in named]
    try:
        loaded.reset()
        ids = torch.tensor([prompt_ids], dtype=torch.long, device=loaded.device)
        loaded.target.forward(ids, 0)
    finally:
        for handle in handles:
            handle.remove()
        loaded.reset()
    return found[0] if found else None
