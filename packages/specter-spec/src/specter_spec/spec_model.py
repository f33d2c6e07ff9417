"""The model protocol the speculative controller drives, for drafts and targets alike."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch

__all__ = ["SpecModel", "check_spec_model", "model_argmax", "model_device", "prefill"]


@runtime_checkable
class SpecModel(Protocol):
    """A causal language model with a key/value cache the controller can roll back.

    The controller keeps every model at "KV for a prefix of the committed
    tokens" between iterations:

    - the **target** holds KV for exactly ``committed_length - 1`` tokens after
      every iteration (the last committed token is the next uncached input);
    - the **draft** holds KV for at most ``committed_length - 1`` committed
      tokens. A draft that shares the target's committed KV (specter-models'
      adapter) reports the target's length plus its own scratch, and after
      ``truncate`` its length equals the target's. A draft with its own KV may
      lag behind (for instance by one token after an iteration whose proposals
      were all accepted, since the last proposal is never fed to it): the
      controller feeds it, in one ``forward``, every committed token it has not
      cached yet.

    The draft's scratch KV must stay invisible to the target: when the target
    verifies, its ``kv_length`` must be ``committed_length - 1`` (the controller
    checks this and raises if it is not).

    Optionally, ``prefill(input_ids, start_pos) -> None``: ``forward`` for tokens whose
    logits nobody reads (the prompt), with the same effect on the KV; an implementation may
    skip computing their logits (a ``[T, V]`` tensor as large as the prompt). The controller
    calls it where a model has it, and ``forward`` otherwise.

    Optionally, ``argmax(logits) -> tokens``: the last dim's argmax of logits the model
    returned, with ``torch.argmax(logits, dim=-1)``'s result (the first index of ties), for
    instance from a faster kernel. Greedy decoding takes each token (the draft's proposals,
    the target's choices) with the model's own where it has one, and ``torch.argmax``
    otherwise. A callable that is not an argmax breaks greedy exactness.

    Attributes:
        kv_length: the number of token positions currently held in the KV
            cache (for a shared-KV draft: committed target KV plus scratch). It
            must be cheap: a Python int, no device synchronisation.
    """

    @property
    def kv_length(self) -> int:
        """Token positions currently held in the KV cache."""
        ...

    def forward(self, input_ids: torch.Tensor, start_pos: int) -> torch.Tensor:
        """Run new tokens and append their KV.

        Args:
            input_ids: ``[1, T]`` int64 token ids at positions
                ``start_pos .. start_pos + T - 1``; ``start_pos`` equals
                ``kv_length`` when called by the controller.
            start_pos: the position of ``input_ids[0, 0]``.

        Returns:
            ``[1, T, V]`` floating-point logits; row ``t`` predicts the token at
            position ``start_pos + t + 1``. Afterwards ``kv_length`` is
            ``start_pos + T``.
        """
        ...

    def truncate(self, length: int) -> None:
        """Drop every KV entry at position ``>= length``.

        A ``length`` at or beyond ``kv_length`` changes nothing; afterwards
        ``kv_length == min(old kv_length, length)``. ``truncate(0)`` empties the
        cache (the controller does this at the start of every generation).
        """
        ...


def check_spec_model(model: object, role: str) -> None:
    """Raise a clear ``TypeError`` if ``model`` does not follow :class:`SpecModel`.

    Args:
        model: the object to check.
        role: ``"draft"`` or ``"target"``, used in the message.

    Raises:
        TypeError: naming the missing members.
    """
    missing = [
        name
        for name, is_ok in (
            ("forward", callable(getattr(model, "forward", None))),
            ("truncate", callable(getattr(model, "truncate", None))),
            ("kv_length", hasattr(model, "kv_length")),
        )
        if not is_ok
    ]
    if missing:
        raise TypeError(
            f"the {role} model {type(model).__name__} does not follow the SpecModel protocol: "
            f"missing {', '.join(missing)}. Wrap a transformers causal LM with "
            "specter_spec.HFCausalLM(model), or implement forward(input_ids, start_pos), "
            "truncate(length) and a kv_length property."
        )


def model_device(model: object) -> torch.device | None:
    device = getattr(model, "device", None)
    return torch.device(device) if isinstance(device, torch.device | str) else None


def model_argmax(model: object) -> Callable[[torch.Tensor], torch.Tensor]:
    """``model``'s optional ``argmax`` (see ``SpecModel``), else ``torch.argmax`` over the
    last dim."""
    own = getattr(model, "argmax", None)
    if own is None:
        return lambda logits: logits.argmax(dim=-1)
    if not callable(own):
        raise TypeError(
            f"{type(model).__name__}.argmax must be callable (logits -> tokens), got "
            f"{type(own).__name__}; remove it to use torch.argmax"
        )
    return own


def prefill(model: SpecModel, input_ids: torch.Tensor, start_pos: int) -> None:
    """Run prompt tokens whose logits nobody reads: the model's optional ``prefill`` (which
    may skip the rows' logits, a ``[T, V]`` tensor as large as the prompt), else
    ``forward``."""
    prefill = getattr(model, "prefill", None)
    if callable(prefill):
        prefill(input_ids, start_pos)
    else:
        model.forward(input_ids, start_pos)
