"""PackedGraphs: a shape is captured at its first forward and replayed after it, with the
new inputs; the least recently used capture goes past the limit; captures share one output
buffer; a failed capture switches graphs off and keeps the eager result. The bookkeeping runs
on the CPU with a stand-in for CUDA's capture (a "graph" that reruns what it recorded); the
real capture runs on a GPU."""

from types import SimpleNamespace

import pytest
import torch

from specter_models import batch_graphs
from specter_models.batch_graphs import PackedGraphs

WEIGHT = torch.arange(1.0, 4.0)


def _forward(calls):
    def forward(ids, positions):  # [N] -> [N, 3]
        calls.append(ids.shape[0])
        return (ids * 10 + positions).float()[:, None] * WEIGHT.to(ids.device)

    return forward


@pytest.fixture
def recorded(monkeypatch):
    """Captures that record their work and rerun it on replay (no CUDA)."""
    monkeypatch.setattr(batch_graphs, "_new_pool", lambda: "pool")
    monkeypatch.setattr(batch_graphs, "_record", lambda pool, work: SimpleNamespace(replay=work))


def _run(graphs, key, ids, positions, calls):
    ids, positions = torch.tensor(ids), torch.tensor(positions)
    out = graphs.run(key, ids, positions, _forward(calls))
    assert torch.equal(out, _forward([])(ids, positions))  # replays see the new inputs
    return out


def test_packed_graphs_need_cuda_and_a_positive_limit():
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA model"):
        PackedGraphs("cpu")
    with pytest.raises(ValueError, match="max_graphs must be an int >= 1"):
        PackedGraphs("cuda", max_graphs=0)


def test_shapes_are_captured_once_replayed_and_the_least_recent_dropped(recorded):
    graphs, calls = PackedGraphs("cuda", max_graphs=2), []
    _run(graphs, "a", [1, 2], [5, 6], calls)  # eager, then captured
    first = _run(graphs, "a", [3, 4], [7, 8], calls)  # replayed
    again = _run(graphs, "a", [4, 4], [0, 0], calls)
    assert not torch.equal(first, again)  # each replay hands back a tensor of its own
    _run(graphs, "b", [1], [0], calls)
    _run(graphs, "a", [9, 9], [1, 2], calls)  # "a" is now the most recent
    _run(graphs, "c", [2, 2, 2], [0, 1, 2], calls)  # drops "b"; the output buffer grows
    assert graphs.stats.as_dict() == {
        "captures": 3, "replays": 3, "eager": 3, "evictions": 1, "disabled_reason": None,
    }  # fmt: skip
    _run(graphs, "a", [5, 6], [3, 4], calls)  # "a" still writes the buffer it was captured on
    _run(graphs, "b", [4], [4], calls)  # captured again
    assert graphs.stats.eager == 4
    assert len(graphs) == 2


def test_a_failed_capture_switches_graphs_off_and_keeps_the_eager_result(monkeypatch):
    monkeypatch.setattr(batch_graphs, "_new_pool", lambda: "pool")

    def refuse(pool, work):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(batch_graphs, "_record", refuse)
    graphs, calls = PackedGraphs("cuda"), []
    with pytest.warns(RuntimeWarning, match="CUDA graphs of batched steps switched off"):
        _run(graphs, "a", [1, 2], [5, 6], calls)
    assert not graphs.active
    assert "not permitted when stream is capturing" in graphs.stats.disabled_reason
    _run(graphs, "a", [3, 4], [7, 8], calls)  # eager from now on, no capture tried
    assert (graphs.stats.eager, graphs.stats.captures, len(graphs)) == (2, 0, 0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_packed_graphs_replay_each_shape_with_its_new_inputs():
    graphs, calls = PackedGraphs("cuda", max_graphs=2), []

    def run(key, ids, positions):
        ids = torch.tensor(ids, device="cuda")
        positions = torch.tensor(positions, device="cuda")
        out = graphs.run(key, ids, positions, _forward(calls))
        assert torch.equal(out, _forward([])(ids, positions))

    run("a", [1, 2], [5, 6])
    run("a", [3, 4], [7, 8])
    run("b", [1, 2, 3], [0, 1, 2])
    run("a", [9, 9], [1, 2])
    assert graphs.stats.as_dict() == {
        "captures": 2, "replays": 2, "eager": 2, "evictions": 0, "disabled_reason": None,
    }  # fmt: skip
