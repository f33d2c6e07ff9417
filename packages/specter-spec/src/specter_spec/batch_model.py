"""The model protocol the batched controller drives: several sequences, each in a KV slot.

A batched model holds ``num_slots`` sequences at once, each with its own KV length, and
runs the new rows of several of them in one forward. Each slot follows the single-sequence
contract of :class:`~specter_spec.spec_model.SpecModel` on its own: the target holds
exactly ``committed - 1`` positions of its sequence between steps, the draft at most that
many (plus scratch while it drafts), and ``truncate`` rolls one slot back without touching
the others.

:class:`SlotModels` builds one from a single-sequence model per slot (each runs its rows
alone): the reference implementation, and a way to batch any ``SpecModel`` (a wrapped
transformers model, the test doubles). specter-models' batched adapters run every slot's
rows in one packed forward instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol, runtime_checkable

import torch

from specter_spec.spec_model import SpecModel, check_spec_model, model_argmax, model_device, prefill

__all__ = ["BatchSpecModel", "SlotModels", "SlotRows", "check_batch_model"]


class SlotRows(NamedTuple):
    """The new rows of one sequence in a batched forward.

    Attributes:
        slot: the sequence's KV slot.
        input_ids: ``[T]`` int64 token ids (``T >= 1``) at positions ``start .. start+T-1``.
        start: the position of ``input_ids[0]``; the slot's ``kv_length`` when called by
            the controller.
    """

    slot: int
    input_ids: torch.Tensor
    start: int


@runtime_checkable
class BatchSpecModel(Protocol):
    """A causal LM holding ``num_slots`` sequences' KV caches, each rolled back alone.

    Optionally ``argmax(logits) -> tokens`` and ``device``, as :class:`SpecModel`'s.

    Attributes:
        num_slots: sequences it holds at once.
    """

    num_slots: int

    def kv_length(self, slot: int) -> int:
        """Positions slot ``slot`` holds (a host int; no device sync)."""
        ...

    def forward_batch(self, rows: Sequence[SlotRows]) -> torch.Tensor:
        """Run each sequence's new rows and append their KV to its slot.

        Args:
            rows: one entry per sequence (distinct slots).

        Returns:
            ``[N, V]`` logits, ``N`` the rows of all entries in order; a row predicts the
            token after it. Afterwards slot ``r.slot`` holds ``r.start + T`` positions.
        """
        ...

    def prefill(self, slot: int, input_ids: torch.Tensor, start_pos: int) -> None:
        """Run prompt tokens ``[1, P]`` of one slot whose logits nobody reads."""
        ...

    def truncate(self, slot: int, length: int) -> None:
        """Drop slot ``slot``'s positions ``>= length`` (see ``SpecModel.truncate``)."""
        ...


def check_batch_model(model: object, role: str) -> None:
    """Raise a clear ``TypeError`` if ``model`` does not follow :class:`BatchSpecModel`.

    Args:
        model: the object to check.
        role: ``"draft"`` or ``"target"``, used in the message.
    """
    missing = [
        name
        for name in ("kv_length", "forward_batch", "prefill", "truncate")
        if not callable(getattr(model, name, None))
    ]
    slots = getattr(model, "num_slots", None)
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
        missing.append("num_slots (an int >= 1)")
    if missing:
        raise TypeError(
            f"the {role} model {type(model).__name__} does not follow the BatchSpecModel "
            f"protocol: missing {', '.join(missing)}. Wrap one single-sequence model per slot "
            "with specter_spec.SlotModels([...]), or implement kv_length(slot), "
            "forward_batch(rows), prefill(slot, ids, start) and truncate(slot, length)."
        )


class SlotModels:
    """A :class:`BatchSpecModel` made of one :class:`SpecModel` per slot, each running its
    own rows (one forward per sequence).

    Args:
        models: one model per slot, distinct objects (each holds its own KV).

    Raises:
        ValueError: no model, or the same object twice.
        TypeError: a model that does not follow ``SpecModel``.
    """

    def __init__(self, models: Sequence[SpecModel]):
        models = list(models)
        if not models:
            raise ValueError("SlotModels needs at least one model (one per slot)")
        if len({id(m) for m in models}) != len(models):
            raise ValueError(
                "SlotModels got the same model object for two slots; each slot needs its own "
                "KV cache: wrap the model once per slot"
            )
        for model in models:
            check_spec_model(model, "slot")
        self.models = models
        self.num_slots = len(models)
        self._argmax: Callable[[torch.Tensor], torch.Tensor] = model_argmax(models[0])

    @property
    def device(self) -> torch.device | None:
        """The first slot's model's device, where it names one."""
        return model_device(self.models[0])

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        """The slots' models' argmax (the first slot's)."""
        return self._argmax(logits)

    def kv_length(self, slot: int) -> int:
        return self.models[slot].kv_length

    def forward_batch(self, rows: Sequence[SlotRows]) -> torch.Tensor:
        outputs = [self.models[r.slot].forward(r.input_ids.unsqueeze(0), r.start)[0] for r in rows]
        return torch.cat(outputs)

    def prefill(self, slot: int, input_ids: torch.Tensor, start_pos: int) -> None:
        prefill(self.models[slot], input_ids, start_pos)

    def truncate(self, slot: int, length: int) -> None:
        self.models[slot].truncate(length)
