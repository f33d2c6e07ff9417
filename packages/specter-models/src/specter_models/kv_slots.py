"""The KV cache of several sequences: one buffer per layer, a slot per sequence.

Batched decoding keeps each sequence's keys and values in a slot of its own: per layer one
buffer ``[M, H, S, D]`` for ``M`` slots of ``S`` positions, and per slot a
:class:`~specter_models.kv_cache.StaticKVCache` whose layers are views of that slot
(``[1, H, S, D]``, the strides of a cache of its own). Each slot keeps its own length, so
every sequence appends, rolls back and reads exactly as a single sequence's cache does:
a slot's prefill and attention run the single-sequence code on that view, with its bits.

Slot 0 is the cache single-sequence decoding (``SpecterModel.kv``) uses; a model loaded
with ``max_batch=1`` has that slot only.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specter_models.kv_cache import RowShape, StaticKVCache

__all__ = ["KVSlots"]


class KVSlots:
    """Per-layer KV buffers of ``num_slots`` sequences, and a ``StaticKVCache`` per slot.

    Args:
        row_shapes: one ``((Hk, Dk), (Hv, Dv))`` per decoder layer.
        max_seq_len: ``S``, positions each slot holds.
        num_slots: ``M``, sequences held at once (>= 1).
        dtype: the model's dtype.
        device: the model's device.

    Raises:
        ValueError: no layer, ``max_seq_len`` or ``num_slots`` below 1.

    Example:
        >>> slots = KVSlots([((2, 8), (2, 8))] * 3, 16, 4, torch.float32, "cpu")
        >>> slots.cache(2).layers[0].keys.shape
        torch.Size([1, 2, 16, 8])
    """

    def __init__(
        self,
        row_shapes: Sequence[RowShape],
        max_seq_len: int,
        num_slots: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ):
        if isinstance(num_slots, bool) or not isinstance(num_slots, int) or num_slots < 1:
            raise ValueError(f"num_slots must be an int >= 1, got {num_slots!r}")
        if not row_shapes:
            raise ValueError("KVSlots needs at least one layer")
        if not isinstance(max_seq_len, int) or max_seq_len < 1:
            raise ValueError(f"max_seq_len must be a positive int, got {max_seq_len!r}")
        self.num_slots = num_slots
        self.max_seq_len = max_seq_len
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        for (hk, dk), (hv, dv) in row_shapes:
            shape = (num_slots, max_seq_len)
            self.keys.append(torch.zeros(shape[0], hk, shape[1], dk, dtype=dtype, device=device))
            self.values.append(torch.zeros(shape[0], hv, shape[1], dv, dtype=dtype, device=device))
        self._caches = [
            StaticKVCache(
                row_shapes,
                max_seq_len,
                dtype,
                device,
                storage=[
                    (k[slot : slot + 1], v[slot : slot + 1])
                    for k, v in zip(self.keys, self.values, strict=True)
                ],
            )
            for slot in range(num_slots)
        ]

    def cache(self, slot: int) -> StaticKVCache:
        """Slot ``slot``'s cache (the same object every call).

        Raises:
            IndexError: no such slot.
        """
        if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < self.num_slots:
            raise IndexError(f"KV slot {slot!r} does not exist: slots are 0..{self.num_slots - 1}")
        return self._caches[slot]

    def lengths(self) -> list[int]:
        """Positions each slot holds (host ints)."""
        return [cache.length for cache in self._caches]

    @property
    def nbytes(self) -> int:
        """Device bytes of every slot's buffers."""
        return sum(k.nbytes + v.nbytes for k, v in zip(self.keys, self.values, strict=True))
