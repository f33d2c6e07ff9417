"""Working set, routing agreement and traces against direct set computations."""

import random

import pytest
import torch

from specter_bench.routing_analysis import (
    draft_plans,
    routing_agreement,
    routing_trace,
    working_set,
    working_set_curve,
)


def _routing(seed: int, T: int, L: int, k: int, E: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    # Distinct experts per (token, layer), as a router's top-k gives.
    return torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T * L)]).view(T, L, k)


@pytest.mark.parametrize(("depth", "stride"), [(1, 1), (3, 1), (4, 4), (7, 2)])
def test_working_set_matches_set_unions(depth, stride):
    routing = _routing(depth, T=23, L=3, k=2, E=9)
    rows = routing.tolist()
    counts = []
    for start in range(0, 23 - depth + 1, stride):
        for layer in range(3):
            counts.append(len({e for t in range(start, start + depth) for e in rows[t][layer]}))
    ws = working_set(routing, depth, stride=stride)
    assert ws.windows * 3 == len(counts)
    assert ws.mean == pytest.approx(sum(counts) / len(counts))
    assert (ws.minimum, ws.maximum) == (min(counts), max(counts))
    per_layer = [sum(counts[layer::3]) / ws.windows for layer in range(3)]
    assert ws.per_layer_mean == pytest.approx(per_layer)
    assert ws.minimum <= ws.p10 <= ws.mean <= ws.p90 <= ws.maximum or ws.p10 <= ws.p90


def test_working_set_at_depth_one_is_top_k_and_grows_with_depth():
    routing = _routing(0, T=40, L=2, k=3, E=16)
    curve = working_set_curve(routing, depths=(1, 2, 4, 8, 16, 32, 64))
    assert [p.depth for p in curve] == [1, 2, 4, 8, 16, 32]  # 64 > T is skipped
    assert curve[0].mean == curve[0].minimum == curve[0].maximum == 3
    means = [p.mean for p in curve]
    assert means == sorted(means)
    assert curve[-1].maximum <= 16


def test_working_set_rejects_bad_input():
    routing = _routing(0, T=5, L=1, k=2, E=4)
    with pytest.raises(ValueError, match=r"depth must be an int in \[1, 5\]"):
        working_set(routing, 6)
    with pytest.raises(ValueError, match="stride"):
        working_set(routing, 2, stride=0)
    with pytest.raises(TypeError, match="integer expert ids"):
        working_set(routing.float(), 2)
    with pytest.raises(ValueError, match=r"\[T, L, k\]"):
        working_set(routing[0], 1)
    with pytest.raises(ValueError, match="negative"):
        working_set(routing - 5, 1)


def test_routing_agreement_counts_shared_experts():
    rng = random.Random(4)
    target = _routing(5, T=17, L=4, k=3, E=8)
    draft = target.clone()
    # Change one expert of some (token, layer) to one outside the target's set.
    changed = set()
    for _ in range(20):
        t, layer, j = rng.randrange(17), rng.randrange(4), rng.randrange(3)
        outside = [e for e in range(8) if e not in target[t, layer].tolist()]
        draft[t, layer, j] = (
            rng.choice(outside) if (t, layer, j) not in changed else draft[t, layer, j]
        )
        changed.add((t, layer, j))
    draft = draft[:, :, torch.randperm(3)]  # order inside a top-k does not matter
    agreement = routing_agreement(draft, target)
    match = [
        [
            len(set(draft[t, layer].tolist()) & set(target[t, layer].tolist())) / 3
            for layer in range(4)
        ]
        for t in range(17)
    ]
    assert agreement.per_token == pytest.approx([sum(row) / 4 for row in match])
    assert agreement.per_layer == pytest.approx(
        [sum(r[layer] for r in match) / 17 for layer in range(4)]
    )
    assert agreement.mean == pytest.approx(sum(map(sum, match)) / 68)
    exact = sum(v == 1.0 for row in match for v in row) / 68
    assert agreement.exact_rate == pytest.approx(exact)
    assert agreement.mean < 1.0
    assert routing_agreement(target, target).mean == 1.0
    with pytest.raises(ValueError, match="same tokens"):
        routing_agreement(draft[:5], target)


def test_routing_trace_groups_tokens_into_steps():
    routing = _routing(6, T=7, L=2, k=2, E=6)
    trace = routing_trace(routing, window=3)
    assert len(trace) == 2
    assert [len(steps) for steps in trace] == [3, 3]  # 3 + 3 + 1 tokens
    for layer in range(2):
        assert trace[layer][2] == set(routing[6, layer].tolist())
        assert trace[layer][0] == set(routing[0:3, layer].flatten().tolist())
    with pytest.raises(ValueError, match="window"):
        routing_trace(routing, window=0)


def test_draft_plans_rank_by_count_then_id():
    draft = torch.tensor([[[3, 1]], [[1, 2]], [[2, 1]], [[5, 0]]])  # T=4, L=1, k=2
    plans = draft_plans(draft, window=3)
    assert plans == [[[1, 2, 3], [0, 5]]]
    assert draft_plans(draft, window=3, top_m=2) == [[[1, 2], [0, 5]]]
    with pytest.raises(ValueError, match="top_m"):
        draft_plans(draft, top_m=[1, 2])
