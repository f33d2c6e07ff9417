"""Streamed fills: a streamed expert written into its spare slot as the kernel reads it."""

import pytest
import torch

import specter_kernels as sk
from kernel_helpers import STREAMED_TOLERANCE as TOLERANCE
from kernel_helpers import all_in_slots, random_routing, rel_err
from kernel_helpers import streamed_problem as problem


def with_spares(w13_slots, w2_slots, count):
    """The slot tensors with ``count`` spare slots at their end (NaN: never read)."""
    pad13 = torch.full((count, *w13_slots.shape[1:]), float("nan")).half()
    pad2 = torch.full((count, *w2_slots.shape[1:]), float("nan")).half()
    return torch.cat([w13_slots, pad13]), torch.cat([w2_slots, pad2])


def expected_assignment(ids, claimed, spare_slots, spare_experts, device_map):
    """The rule, written out: (fills, device map after)."""
    E = claimed.numel()
    routed = sorted({e for e in ids.reshape(-1).tolist() if 0 <= e < E})
    missing = [e for e in routed if claimed[e] < 0]
    usable = [
        (int(s), int(h))
        for s, h in zip(spare_slots.tolist(), spare_experts.tolist(), strict=True)
        if s >= 0 and h not in routed
    ]
    fills, after = [-1] * E, device_map.tolist()
    for e, (slot, holder) in zip(missing, usable, strict=False):
        fills[e] = slot
        if holder >= 0:
            after[holder] = -1
    return fills, after


@pytest.mark.parametrize("T", [1, 4, 9])
def test_assignment_matches_the_rule_and_the_reference(seed, backend, T):
    E, k = 12, 3
    ids, _ = random_routing(T, k, E)
    ids[0, -1] = -1  # a padding pair routes nowhere
    claimed = torch.where(torch.rand(E) < 0.5, torch.arange(E), -1).to(torch.int32)
    holders = [e for e in range(E) if claimed[e] >= 0]
    cases = (
        ([9, 4], [-1, -1]),
        ([5, 8, 2, 11, 7, -1, -1], [-1, *holders[:4], -1, -1]),
        ([], []),
        ([6, -1], [holders[0] if holders else -1, -1]),
    )
    for slots, owners in cases:
        owners = (owners + [-1] * len(slots))[: len(slots)]
        slots = torch.tensor(slots, dtype=torch.int32)
        owners = torch.tensor(owners, dtype=torch.int32)
        device_map = claimed.clone()
        out = torch.full((E,), 99, dtype=torch.int32)
        want_fills, want_map = expected_assignment(ids, claimed, slots, owners, device_map)
        fill = sk.assign_fill_slots(ids, claimed, slots, owners, device_map, out)
        assert fill is out
        assert fill.tolist() == want_fills
        assert device_map.tolist() == want_map
        ref_map = claimed.clone()
        ref = sk.assign_fill_slots_reference(ids, claimed, slots, owners, ref_map)
        assert torch.equal(fill, ref)
        assert torch.equal(device_map, ref_map)


def test_assignment_example(backend):
    ids = torch.tensor([[3, 1], [5, 2]])
    claimed = torch.tensor([0, -1, 1, -1, 2, -1], dtype=torch.int32)
    device_map = claimed.clone()
    slots = torch.tensor([1, 2, 5], dtype=torch.int32)
    holders = torch.tensor([2, 4, -1], dtype=torch.int32)
    fill = sk.assign_fill_slots(ids, claimed, slots, holders, device_map)
    assert fill.tolist() == [-1, 2, -1, 5, -1, -1]  # slot 1's expert 2 is routed: kept
    assert device_map.tolist() == [0, -1, 1, -1, -1, -1]  # expert 4 evicted for expert 1


@pytest.mark.parametrize(("T", "resident", "spares"), [(1, 3, 2), (6, 2, 3), (40, 1, 8)])
@pytest.mark.parametrize("per_pair", [True, False])
def test_fills_hold_the_streamed_experts_and_change_no_bit(
    seed, poisoned, T, resident, spares, per_pair
):
    H, I, E, k = 64, 32, 8, 3
    if T == 40:
        E = 4  # 30 pairs per expert: several aligned blocks, only the first fills
    x, ids, weights, w13, w2, w13_slots, w2_slots, slot_of, streamed = problem(
        T, H, I, E, k, resident, stream_one=True
    )
    first_spare = w13_slots.shape[0]
    w13_slots, w2_slots = with_spares(w13_slots, w2_slots, spares)
    spare_ids = torch.arange(first_spare, first_spare + spares, dtype=torch.int32)
    no_holders = torch.full((spares,), -1, dtype=torch.int32)
    before13, before2 = w13_slots.clone(), w2_slots.clone()
    shape = (T, k, H) if per_pair else (T, H)
    every = torch.ones(E, dtype=torch.bool)
    plain, flags_plain = torch.zeros(shape), torch.zeros(2, E, dtype=torch.uint8)
    sk.grouped_moe_fp16(
        x, ids, weights, w13_slots, w2_slots, slot_of, every, plain, None, streamed, flags_plain
    )  # fmt: skip
    fill = sk.assign_fill_slots(ids, slot_of, spare_ids, no_holders, slot_of.clone())
    out, flags = torch.zeros(shape), torch.zeros(2, E, dtype=torch.uint8)
    sk.grouped_moe_fp16(
        x, ids, weights, w13_slots, w2_slots, slot_of, every, out, None, streamed, flags, fill
    )  # fmt: skip
    if per_pair:
        assert torch.equal(out, plain)  # filling changes no bit
    else:
        assert rel_err(out, plain) < TOLERANCE
    assert torch.equal(flags, flags_plain)
    filled = {e: int(s) for e, s in enumerate(fill.tolist()) if s >= 0}
    assert filled, "the problem must stream at least one expert"
    for e, s in filled.items():
        assert torch.equal(w13_slots[s], w13[e])
        assert torch.equal(w2_slots[s], w2[e])
    untouched = [s for s in range(w13_slots.shape[0]) if s not in filled.values()]
    for s in untouched:  # resident slots and unused spares keep their bits (NaN included)
        assert torch.equal(w13_slots[s].view(torch.int16), before13[s].view(torch.int16))
        assert torch.equal(w2_slots[s].view(torch.int16), before2[s].view(torch.int16))
    # The filled experts now read from their slots give the same bits again.
    refill = slot_of.clone()
    for e, s in filled.items():
        refill[e] = s
    again = torch.zeros(shape)
    sk.grouped_moe_fp16(x, ids, weights, w13_slots, w2_slots, refill, every, again, None, streamed)
    if per_pair:
        assert torch.equal(again, plain)
    else:
        assert rel_err(again, plain) < TOLERANCE
    expected_all = all_in_slots(x, ids, weights, w13, w2, torch.zeros(shape))
    assert rel_err(out, expected_all) < TOLERANCE


def test_reference_fills_like_the_kernel(seed, poisoned):
    T, H, I, E, k = 5, 64, 32, 8, 2
    x, ids, weights, _, _, w13_slots, w2_slots, slot_of, streamed = problem(T, H, I, E, k, 3)
    w13_slots, w2_slots = with_spares(w13_slots, w2_slots, 2)
    spare_ids = torch.tensor([w13_slots.shape[0] - 1, w13_slots.shape[0] - 2], dtype=torch.int32)
    no_holders = torch.full((2,), -1, dtype=torch.int32)
    fill = sk.assign_fill_slots_reference(ids, slot_of, spare_ids, no_holders, slot_of.clone())
    every = torch.ones(E, dtype=torch.bool)
    results = []
    for run in ("kernel", "reference"):
        s13, s2 = w13_slots.clone(), w2_slots.clone()
        out = torch.zeros(T, k, H)
        args = (x, ids, weights, s13, s2, slot_of, every, out)
        if run == "kernel":
            sk.grouped_moe_fp16(*args, None, streamed, None, fill)
        else:
            sk.grouped_moe_fp16_reference(*args, streamed, None, fill)
        results.append((out, s13.view(torch.int16), s2.view(torch.int16)))
    assert rel_err(results[0][0], results[1][0]) < TOLERANCE
    assert torch.equal(results[0][1], results[1][1])  # the same slots filled, bit for bit
    assert torch.equal(results[0][2], results[1][2])


def test_bad_fills_are_refused(triton_backend):
    T, H, I, E, k = 3, 32, 16, 4, 2
    x, ids, weights, _, _, w13_slots, w2_slots, slot_of, streamed = problem(T, H, I, E, k, 1)
    every = torch.ones(E, dtype=torch.bool)
    out = torch.zeros(T, H)
    fill = torch.full((E,), -1, dtype=torch.int32)
    args = (x, ids, weights, w13_slots, w2_slots, slot_of, every, out)
    with pytest.raises(ValueError, match="fill_slots is given without streamed experts"):
        sk.grouped_moe_fp16(*args, None, None, None, fill)
    with pytest.raises(TypeError, match=r"fill_slots must be a contiguous int32 \[E=4\]"):
        sk.grouped_moe_fp16(*args, None, streamed, None, fill.long())
    with pytest.raises(ValueError, match="fill_slots with pair_blocks needs one row"):
        sk.grouped_moe_fp16(*args, True, streamed, None, fill)
    spare = torch.tensor([1, 2], dtype=torch.int32)
    with pytest.raises(TypeError, match="spare_slots must be a contiguous int32 vector"):
        sk.assign_fill_slots(ids, slot_of, spare.long(), spare, slot_of)
    with pytest.raises(ValueError, match=r"spare_experts needs one entry per spare slot \(2\)"):
        sk.assign_fill_slots(ids, slot_of, spare, spare[:1], slot_of)
    with pytest.raises(ValueError, match="claimed and expert_to_slot need one entry per expert"):
        sk.assign_fill_slots(ids, slot_of, spare, spare, slot_of[:3])
    with pytest.raises(TypeError, match=r"out must be a contiguous int32 \[E=4\]"):
        sk.assign_fill_slots(ids, slot_of, spare, spare, slot_of, torch.zeros(3, dtype=torch.int32))
    with pytest.raises(TypeError, match="topk_ids must be int32 or int64"):
        sk.assign_fill_slots(ids.float(), slot_of, spare, spare, slot_of)
