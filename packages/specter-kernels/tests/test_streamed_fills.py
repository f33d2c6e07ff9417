"""Streamed fills: a streamed expert written into its spare slot as the kernel reads it."""

import pytest
import torch

import specter_kernels as sk
from kernel_helpers import random_routing, rel_err
from test_streamed_experts import TOLERANCE, all_in_slots, problem


def with_spares(w13_slots, w2_slots, count):
    """The slot tensors with ``count`` spare slots at their end (NaN: never read)."""
    pad13 = torch.full((count, *w13_slots.shape[1:]), float("nan")).half()
    pad2 = torch.full((count, *w2_slots.shape[1:]), float("nan")).half()
    return torch.cat([w13_slots, pad13]), torch.cat([w2_slots, pad2])


@pytest.mark.parametrize("T", [1, 4, 9])
def test_assignment_matches_the_reference(seed, backend, T):
    E, k = 12, 3
    ids, _ = random_routing(T, k, E)
    ids[0, -1] = -1  # a padding pair routes nowhere
    slot_of = torch.where(torch.rand(E) < 0.5, torch.arange(E), -1).to(torch.int32)
    for spares in ([9, 4], [5, 8, 2, 11, 7, -1, -1], [], [6, -1]):
        spares = torch.tensor(spares, dtype=torch.int32)
        out = torch.full((E,), 99, dtype=torch.int32)
        fill = sk.assign_fill_slots(ids, slot_of, spares, out)
        assert fill is out
        routed = sorted({e for e in ids.reshape(-1).tolist() if e >= 0})
        missing = [e for e in routed if slot_of[e] < 0]
        expected = [-1] * E
        for rank, e in enumerate(missing[: spares.numel()]):
            expected[e] = int(spares[rank])
        assert fill.tolist() == expected
        assert torch.equal(fill, sk.assign_fill_slots_reference(ids, slot_of, spares))


def test_assignment_example(backend):
    ids = torch.tensor([[3, 1], [5, 1]])
    slot_of = torch.tensor([0, -1, 1, -1, 2, -1], dtype=torch.int32)
    fill = sk.assign_fill_slots(ids, slot_of, torch.tensor([7, 6], dtype=torch.int32))
    assert fill.tolist() == [-1, 7, -1, 6, -1, -1]  # expert 5 ranks third: no spare left


@pytest.mark.parametrize(("T", "resident", "spares"), [(1, 3, 2), (6, 2, 3), (40, 1, 8)])
@pytest.mark.parametrize("per_pair", [True, False])
def test_fills_hold_the_streamed_experts_and_change_no_bit(
    seed, poisoned, T, resident, spares, per_pair
):
    H, I, E, k = 64, 32, 8, 3
    if T == 40:
        E = 4  # 30 pairs per expert: several aligned blocks, only the first fills
    x, ids, weights, w13, w2, w13_slots, w2_slots, slot_of, streamed = problem(
        T, H, I, E, k, resident
    )
    first_spare = w13_slots.shape[0]
    w13_slots, w2_slots = with_spares(w13_slots, w2_slots, spares)
    spare_ids = torch.arange(first_spare, first_spare + spares, dtype=torch.int32)
    before13, before2 = w13_slots.clone(), w2_slots.clone()
    shape = (T, k, H) if per_pair else (T, H)
    every = torch.ones(E, dtype=torch.bool)
    plain, flags_plain = torch.zeros(shape), torch.zeros(2, E, dtype=torch.uint8)
    sk.grouped_moe_fp16(
        x, ids, weights, w13_slots, w2_slots, slot_of, every, plain, None, streamed, flags_plain
    )  # fmt: skip
    fill = sk.assign_fill_slots(ids, slot_of, spare_ids)
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
    fill = sk.assign_fill_slots_reference(ids, slot_of, spare_ids)
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
    with pytest.raises(TypeError, match="spares must be a contiguous int32 vector"):
        sk.assign_fill_slots(ids, slot_of, torch.tensor([1, 2]))
    with pytest.raises(TypeError, match=r"out must be a contiguous int32 \[E=4\]"):
        sk.assign_fill_slots(ids, slot_of, fill, torch.zeros(3, dtype=torch.int32))
    with pytest.raises(TypeError, match="topk_ids must be int32 or int64"):
        sk.assign_fill_slots(ids.float(), slot_of, fill)
