"""KVSlots: a buffer per layer for several sequences, a StaticKVCache per slot."""

from __future__ import annotations

import pytest
import torch

from specter_models.kv_cache import StaticKVCache
from specter_models.kv_slots import KVSlots

ROWS = [((2, 4), (2, 3))] * 2


def test_each_slot_is_a_cache_of_its_own_over_one_buffer():
    slots = KVSlots(ROWS, 8, 3, torch.float64, "cpu")
    first, second = slots.cache(0), slots.cache(2)
    assert slots.cache(2) is second
    keys = torch.randn(1, 2, 5, 4, dtype=torch.float64)
    values = torch.randn(1, 2, 5, 3, dtype=torch.float64)
    second.update(keys, values, layer_idx=1)
    assert slots.lengths() == [0, 0, 0]  # a length is layer 0's
    assert second.layers[1].length == 5
    assert torch.equal(slots.keys[1][2, :, :5], keys[0])  # written into slot 2 of the buffer
    assert not slots.keys[1][:2].any()
    first.update(keys[:, :, :2], values[:, :, :2], layer_idx=0)
    second.crop_to(1)
    assert first.layers[0].length == 2
    assert slots.nbytes == 3 * 2 * 8 * (2 * 4 + 2 * 3) * 8


def test_bad_slots_and_storage_fail_clearly():
    with pytest.raises(ValueError, match="num_slots must be an int >= 1"):
        KVSlots(ROWS, 8, 0, torch.float64, "cpu")
    slots = KVSlots(ROWS, 8, 2, torch.float64, "cpu")
    with pytest.raises(IndexError, match="KV slot 2 does not exist"):
        slots.cache(2)
    wrong = [(torch.zeros(1, 2, 8, 4), torch.zeros(1, 2, 8, 3))] * 2  # float32
    with pytest.raises(ValueError, match="storage keys is"):
        StaticKVCache(ROWS, 8, torch.float64, "cpu", storage=wrong)
    with pytest.raises(ValueError, match="holds 1 layers for 2 row shapes"):
        StaticKVCache(ROWS, 8, torch.float64, "cpu", storage=wrong[:1])
