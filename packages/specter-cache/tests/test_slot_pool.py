"""Slot pools: expert-id validation, slot counts from a count or a budget, landed loads."""

import pytest
import torch

from cache_helpers import build_store
from specter_cache.copy_engine import DeferredCopyEngine
from specter_cache.slot_pool import LayerPool, as_expert_list, resolve_slot_counts


def test_expert_lists_are_unique_in_first_seen_order_from_lists_and_tensors():
    assert as_expert_list([3, 1, 3, 0, 1], 4, "here") == [3, 1, 0]
    assert as_expert_list(torch.tensor([[2, 0], [2, 1]]), 4, "here") == [2, 0, 1]
    assert as_expert_list(range(3), 4, "here") == [0, 1, 2]
    assert as_expert_list([], 4, "here") == []


@pytest.mark.parametrize(
    ("experts", "error", "match"),
    [
        ([0, 4], ValueError, r"here: expert ids must be ints in \[0, 4\), got 4"),
        ([-1], ValueError, r"got -1"),
        ([True], ValueError, r"got True"),
        ([1.0], ValueError, r"got 1.0"),
        (3, TypeError, r"here: experts must be a sequence of ints"),
        ("01", TypeError, r"experts must be a sequence of ints"),
    ],
)
def test_bad_expert_ids_name_the_value(experts, error, match):
    with pytest.raises(error, match=match):
        as_expert_list(experts, 4, "here")


def test_slot_counts_from_a_count_a_list_or_a_budget():
    store, _ = build_store(3, 6)
    per_slot = 3 * store.expert_bytes(0)
    assert resolve_slot_counts(store, 2, None) == [2, 2, 2]
    assert resolve_slot_counts(store, [1, 6, 3], None) == [1, 6, 3]
    assert resolve_slot_counts(store, None, 4 * per_slot + per_slot - 1) == [4, 4, 4]
    assert resolve_slot_counts(store, None, 100 * per_slot) == [6, 6, 6]
    with pytest.raises(ValueError, match=r"slots per layer must be ints in \[1, 6\], got 0"):
        resolve_slot_counts(store, [1, 0, 1], None)
    with pytest.raises(
        ValueError, match=rf"budget_bytes=1 is below one slot per layer \({per_slot}"
    ):
        resolve_slot_counts(store, None, 1)


def test_a_landed_load_drops_its_event_and_an_empty_pool_hands_out_slot_0_first():
    store, _ = build_store(1, 4)
    pool = LayerPool(store, 0, 3, torch.device("cpu"), torch.full((4,), -1, dtype=torch.int32))
    assert pool.empty.pop() == 0
    engine = DeferredCopyEngine("cpu")
    with engine.copy_context():
        engine.copy(pool.slot_views[0][0], store.get(0, 1)[pool.names[0]])
        pool.ready[0] = engine.record()
    assert not pool.landed(0)
    assert pool.ready[0] is not None  # still loading: the event is kept
    engine.synchronize()
    assert pool.landed(0)
    assert pool.ready[0] is None  # landed: never queried again
    assert pool.landed(1)  # never loaded
    pool.slot_expert[0], pool.protect[1] = 1, 1
    assert pool.evictable_slots(keep={1}) == [2]  # slot 0 keeps expert 1, slot 1 is protected
