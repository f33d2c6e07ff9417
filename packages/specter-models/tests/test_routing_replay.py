"""Routing replay: a model of other weights computes exactly the recorded experts and accepts
exactly what the recording decides."""

import pytest
import torch

from specter_models import RoutingReplayConfig, RoutingTrace, replay_routing
from specter_models.loader import load_model
from specter_models.routing_recorder import RoutingRecorder, record_sequence
from specter_spec import SpecController

ARCH = "tiny-deepseek-v2"
PROMPTS = ([5, 9, 17, 33, 40], [7, 3, 60, 12, 8, 90, 4])
NEW_TOKENS = 14
CONTINUATION = NEW_TOKENS + 4


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    """Two sequences recorded on the seed-0 weights, saved and read back."""
    lm = load_model(ARCH, device="cpu", dtype=torch.float32, seed=0, max_seq_len=64)
    recorder = RoutingRecorder(lm.model)
    sequences = [
        record_sequence(recorder, lm, p, CONTINUATION, prompt_id=f"p{i}", source="test")
        for i, p in enumerate(PROMPTS)
    ]
    recorder.remove()
    trace = RoutingTrace(
        ARCH, lm.cache.num_layers, lm.cache.num_experts, lm.config.num_experts_per_tok,
        tuple(sequences),
    )  # fmt: skip
    path = tmp_path_factory.mktemp("trace") / "trace.pt"
    trace.save(path)
    return RoutingTrace.load(path)


class ExpertSpy:
    """Records, per adapter forward, the ids each experts module computed and the router's
    own ids (a pre-hook sees those)."""

    def __init__(self, lm) -> None:
        self.forwards = []  # (role, start, rows, {layer: ids}, {layer: router ids})
        for role in ("target", "draft"):
            adapter = getattr(lm, role)
            if adapter is not None:
                adapter.forward = self._wrap_forward(role, adapter.forward)
        for module in lm.experts:
            module._draft = self._wrap_experts(module, module._draft)
            module.target_forward = self._wrap_experts(module, module.target_forward)
            module.register_forward_pre_hook(self._router_hook(module), with_kwargs=True)

    def _wrap_forward(self, role, forward):
        def wrapped(input_ids, start_pos):
            self.forwards.append((role, start_pos, input_ids.shape[1], {}, {}))
            return forward(input_ids, start_pos)

        return wrapped

    def _wrap_experts(self, module, method):
        def wrapped(x, ids, weights, *args, **kwargs):
            self.forwards[-1][3][module.layer] = ids.clone()
            return method(x, ids, weights, *args, **kwargs)

        return wrapped

    def _router_hook(self, module):
        def hook(mod, args, kwargs):
            self.forwards[-1][4][module.layer] = args[1].clone()

        return hook


def _expected_accepted(agree: torch.Tensor, n: int, depth: int) -> int:
    accepted = 0
    while accepted < depth and bool(agree[n - 1 + accepted]):
        accepted += 1
    return accepted


@pytest.mark.parametrize(
    ("slots", "miss_path", "window_mode"),
    [(None, "load", False), (3, "load", False), (3, "stream", True), (5, "load", True)],
)
def test_replay_computes_the_recorded_experts_and_accepts_what_the_trace_decides(
    trace, slots, miss_path, window_mode
):
    lm = load_model(
        ARCH, device="cpu", dtype=torch.float32, seed=1, max_seq_len=64, slots_per_layer=slots,
        policy="predictive", miss_path=miss_path,
    )  # fmt: skip
    if window_mode:  # the CUDA graphs' window forwards, run eagerly (piecewise under a budget)
        lm.enable_step_graphs(capture=False, piecewise=True)
    replay = replay_routing(lm, trace)
    spy = ExpertSpy(lm)
    controller = SpecController(lm.draft, lm.target, cache=lm.prefetcher, depth=3)
    differs = 0
    for index, sequence in enumerate(trace.sequences):
        spy.forwards.clear()
        lm.reset()
        controller.acceptance = replay.start(replay.prompt(index), NEW_TOKENS)
        assert replay.sequence == index
        result = controller.generate(replay.prompt(index), NEW_TOKENS)
        P = sequence.prompt_len
        assert result.tokens == sequence.tokens[P : P + NEW_TOKENS].tolist()
        n = P
        for it in result.stats.iterations:
            assert it.accepted == _expected_accepted(sequence.agree, n, it.depth)
            n += it.committed
        # Every forward's experts, layer by layer: the trace's rows at its positions.
        layers = range(trace.moe_layers)
        for role, start, rows, ids, router in spy.forwards:
            table = sequence.target if role == "target" else sequence.draft
            assert sorted(ids) == list(layers), (role, start)
            for layer in layers:
                expected = table[start : start + rows, layer].long()
                assert torch.equal(ids[layer][:rows], expected), (role, start, layer)
                differs += not torch.equal(router[layer][:rows], expected)
        roles = [f[0] for f in spy.forwards]
        assert "draft" in roles
        assert roles.count("target") >= 2
    assert differs > 0  # the replayed model's own router routes elsewhere


def test_the_draft_counter_sees_the_recorded_routing(trace):
    lm = load_model(ARCH, device="cpu", dtype=torch.float32, seed=2, max_seq_len=64)
    replay = replay_routing(lm, trace)
    sequence = trace.sequences[0]
    replay.select(0, NEW_TOKENS)
    P = sequence.prompt_len
    lm.counter.clear()
    lm.draft.forward(sequence.tokens[: P + 2].view(1, -1), 0)
    counts = lm.counter.counts.cpu()
    expected = torch.zeros_like(counts)
    for layer in range(trace.moe_layers):
        ids = sequence.draft[: P + 2, layer].long().flatten()
        expected[layer] += torch.bincount(ids, minlength=counts.shape[1]).to(counts.dtype)
    assert torch.equal(counts, expected)


def test_a_trace_of_another_topology_or_too_short_is_refused(trace):
    other = load_model("tiny-qwen2-moe", device="cpu", dtype=torch.float32, max_seq_len=64)
    with pytest.raises(ValueError, match=r"2 MoE layers, 8 experts and top-2; .* top-3"):
        replay_routing(other, trace)
    lm = load_model(ARCH, device="cpu", dtype=torch.float32, seed=1, max_seq_len=64)
    replay = replay_routing(lm, RoutingReplayConfig(trace.path))
    with pytest.raises(ValueError, match=f"{CONTINUATION} continuation tokens; decoding 40"):
        replay.start(PROMPTS[0], 40)
    with pytest.raises(ValueError, match=r"none of routing trace trace\.pt's 2 sequence prompts"):
        replay.start([1, 2, 3], 4)
    with pytest.raises(RuntimeError, match="replays a routing trace already"):
        replay_routing(lm, trace)
    plain = load_model(ARCH, device="cpu", dtype=torch.float32, max_seq_len=64, draft=None)
    target_only = RoutingTrace(
        trace.model, trace.moe_layers, trace.num_experts, trace.top_k,
        tuple(s.__class__(s.prompt_id, s.source, s.tokens, s.prompt_len, s.target, None, None)
              for s in trace.sequences),
    )  # fmt: skip
    replay_routing(plain, target_only)  # no draft: the target's routing is enough
    with pytest.raises(ValueError, match="holds the target's routing only"):
        replay_routing(load_model(ARCH, device="cpu", dtype=torch.float32), target_only)


def test_a_trace_round_trips_and_old_dumps_are_named(trace, tmp_path):
    again = RoutingTrace.from_dump(trace.as_dump())
    assert (again.model, again.moe_layers, again.num_experts, again.top_k) == (
        ARCH, 2, 8, 2,
    )  # fmt: skip
    for a, b in zip(again.sequences, trace.sequences, strict=True):
        assert (a.prompt_id, a.prompt_len) == (b.prompt_id, b.prompt_len)
        for name in ("tokens", "target", "draft", "agree"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
    first = trace.sequences[0]
    assert first.length == len(PROMPTS[0]) + CONTINUATION
    assert (first.target.dtype, first.agree.dtype) == (torch.uint8, torch.bool)
    old = {"model": ARCH, "prompt_ids": ["p"], "prompt_lens": [3], "target": [], "draft": []}
    torch.save(old, tmp_path / "old.pt")
    with pytest.raises(ValueError, match=r"version-1 routing dump .* record it again"):
        RoutingTrace.load(tmp_path / "old.pt")
    with pytest.raises(FileNotFoundError, match="write one with `specter record-routing`"):
        RoutingTrace.load(tmp_path / "none.pt")
    with pytest.raises(ValueError, match=r"RoutingReplayConfig\.sequence=-1"):
        RoutingReplayConfig("t.pt", -1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("miss_path", ["stream", "load"])  # one graph / piecewise graphs
def test_cuda_graphs_replay_the_recorded_experts(trace, miss_path):
    lm = load_model(
        ARCH, device="cuda", dtype=torch.float16, seed=1, max_seq_len=64, slots_per_layer=3,
        policy="predictive", miss_path=miss_path, cuda_graphs=True, piecewise_graphs=True,
    )  # fmt: skip
    replay = replay_routing(lm, trace)
    lm.capture_step_graphs(64)
    for index, sequence in enumerate(trace.sequences):
        acceptance = replay.start(replay.prompt(index), NEW_TOKENS)
        controller = SpecController(
            lm.draft, lm.target, cache=lm.prefetcher, depth=3, acceptance=acceptance
        )
        lm.reset()
        result = controller.generate(replay.prompt(index), NEW_TOKENS)
        P = sequence.prompt_len
        assert result.tokens == sequence.tokens[P : P + NEW_TOKENS].tolist()
        n = P
        for it in result.stats.iterations:
            assert it.accepted == _expected_accepted(sequence.agree, n, it.depth)
            n += it.committed
    stats = lm.graph_stats()
    assert stats["draft"]["replays"] > 0
    assert stats["target"]["replays"] > 0
    # The ids inside the replayed graphs, step by step: the draft's through its routing
    # counter, the target's through the streamed record (one graph) or the routing trace
    # its eager expert calls keep between the pieces.
    sequence = trace.sequences[0]
    replay.select(0, NEW_TOKENS)
    lm.reset()
    tokens = sequence.tokens.cuda()
    P = sequence.prompt_len
    lm.target.forward(tokens[: P - 1].view(1, -1), 0)
    lm.runtime.record_routing(miss_path == "load")
    replays = lm.graph_stats()["draft"]["replays"]
    for p in range(P - 1, P + 6):
        lm.counter.clear()
        lm.draft.forward(tokens[p : p + 1].view(1, 1), p)
        counts = lm.counter.counts.cpu().long()
        for layer in range(trace.moe_layers):
            expected = torch.bincount(sequence.draft[p, layer].long(), minlength=8)
            assert torch.equal(counts[layer], expected), (p, layer)
        lm.target.forward(tokens[p : p + 1].view(1, 1), p)
        for layer in range(trace.moe_layers):
            expected = sequence.target[p, layer].long()
            if miss_path == "stream":
                got = lm.runtime.stream_record.ids[layer, 0].cpu()
                assert torch.equal(got, expected), (p, layer)
            else:
                got = lm.runtime.routing_trace[layer][-1]
                assert got == sorted(set(expected.tolist())), (p, layer)
    assert lm.graph_stats()["draft"]["replays"] == replays + 7
