"""The engine on a CUDA device: Triton kernels, the copy stream, and no host sync in the
draft's decode step. Skipped without a GPU (run them on a CUDA machine)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from specter_models import RowTruncation, build_reference_model, reference_model_from
from specter_models.loader import load_model
from specter_spec import SpecController

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
TINY = ("tiny-deepseek-v2", "tiny-qwen2-moe", "tiny-phimoe")
BUDGETED = {
    "device": "cuda", "dtype": torch.float16, "slots_per_layer": 2, "seed": 9, "max_seq_len": 320
}  # fmt: skip
"""A tiny model's fp16 load on the GPU with 2 slots a layer (the tests add their options)."""


@contextlib.contextmanager
def _host_sync_forbidden():
    """Inside the block a host sync raises (torch's sync debug mode)."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("name", TINY)
def test_cuda_target_matches_transformers_and_speculation_is_exact(name):
    lm = load_model(name, device="cuda", dtype=torch.float16, slots_per_layer=3, seed=1)
    assert lm.cache.store.is_pinned
    assert lm.runtime.invariant_draft_linears  # the default on CUDA
    generator = torch.Generator("cuda").manual_seed(3)
    ids = torch.randint(0, lm.config.vocab_size, (1, 12), device="cuda", generator=generator)
    got = lm.target.forward(ids, 0).float()
    reference = reference_model_from(lm)
    with torch.no_grad():
        expected = reference(ids).logits.float()
    # Per position. Our sums run in another order than cuBLAS's, so a near tie in a router
    # (PhiMoE's sparsemixer thresholds) may pick another expert than transformers at one
    # position (seen once in three runs of random ids); every other position must match.
    error = (got - expected).abs().amax(dim=-1)[0]
    assert int((error >= 0.02 * expected.abs().max()).sum()) <= 1, error
    prompt = ids[0, :6].tolist()
    spec = SpecController(lm.draft, lm.target, cache=lm.prefetcher, depth=4).generate(prompt, 24)
    plain = SpecController(None, lm.target, depth=0).generate(prompt, 24)
    assert spec.tokens == plain.tokens
    assert lm.cache.stats()["total"]["misses"] > 0


@pytest.mark.parametrize("name", TINY)
def test_cuda_expert_wise_equals_token_wise(name):
    out = {}
    ids = torch.randint(
        0, 96, (1, 9), device="cuda", generator=torch.Generator("cuda").manual_seed(0)
    )
    for kind in ("expert", "token"):
        lm = load_model(
            name, device="cuda", dtype=torch.float16, slots_per_layer=2, verification=kind
        )
        lm.target.forward(ids[:, :4], 0)
        out[kind] = lm.target.forward(ids[:, 4:], 4).float()
    assert (out["expert"] - out["token"]).abs().max() < 0.01 * out["expert"].abs().max()


@pytest.mark.parametrize("name", TINY)
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphed"])
def test_cuda_draft_step_has_no_host_sync(name, graphs):
    lm = load_model(name, device="cuda", dtype=torch.float16, slots_per_layer=3, cuda_graphs=graphs)
    lm.target.forward(torch.tensor([[1, 2, 3, 4]], device="cuda"), 0)
    token = torch.tensor([[5]], device="cuda")
    for _ in range(2):  # warm-up: kernels compiled, buffers grown, the step's graph captured
        lm.draft.forward(token, 4)
        lm.draft.truncate(4)
    if graphs:
        lm.draft.graphs.stats.reset_counts()
    with _host_sync_forbidden():
        for position in range(4, 8):
            logits = lm.draft.forward(token, position)
            token = logits[:, -1].argmax(-1, keepdim=True)
    assert lm.draft.kv_length == 8
    if graphs:
        assert lm.graph_stats()["draft"]["replays"] == 4


@pytest.mark.parametrize("name", TINY)
def test_cuda_build_reference_model_accepts_an_unindexed_device(name):
    # "cuda" (no index) once failed: buffers report "cuda:0", which compares unequal.
    model = build_reference_model(name, seed=2, device="cuda", dtype=torch.float16)
    devices = {p.device for p in model.parameters()} | {b.device for b in model.buffers()}
    assert devices == {torch.device("cuda", torch.cuda.current_device())}


@pytest.mark.parametrize("name", TINY)
@pytest.mark.parametrize("slots", [2, None])
def test_cuda_batch_invariant_rows_and_exact_speculation(name, slots):
    lm = load_model(name, device="cuda", dtype=torch.float16, slots_per_layer=slots, seed=3)
    assert lm.batch_invariant  # the default for fp16 on CUDA
    generator = torch.Generator("cuda").manual_seed(5)
    prompt = torch.randint(0, lm.config.vocab_size, (1, 7), device="cuda", generator=generator)
    rows = torch.randint(0, lm.config.vocab_size, (1, 9), device="cuda", generator=generator)
    lm.target.forward(prompt, 0)
    together = lm.target.forward(rows, 7)[0]
    lm.target.truncate(7)
    alone = torch.stack([lm.target.forward(rows[:, i : i + 1], 7 + i)[0, 0] for i in range(9)])
    assert torch.equal(together, alone)
    lm.reset()
    plain = SpecController(None, lm.target, depth=0).generate(prompt[0].tolist(), 48)
    for depth in (2, 5):
        lm.reset()
        spec = SpecController(lm.draft, lm.target, cache=lm.prefetcher, depth=depth)
        assert spec.generate(prompt[0].tolist(), 48).tokens == plain.tokens


@pytest.mark.parametrize("name", TINY)
@pytest.mark.parametrize("graphs", [False, True], ids=["eager", "graphed"])
def test_cuda_all_resident_target_step_has_no_host_sync(name, graphs):
    # every expert resident
    lm = load_model(name, device="cuda", dtype=torch.float16, seed=4, cuda_graphs=graphs)
    lm.target.forward(torch.tensor([[1, 2, 3, 4]], device="cuda"), 0)
    rows = torch.tensor([[5, 6, 7]], device="cuda")
    for _ in range(2):  # warm-up: kernels compiled, both steps' graphs captured
        lm.target.forward(rows, 4)
        lm.target.forward(rows[:, :1], 7)
        lm.target.truncate(4)
    if graphs:
        lm.target.graphs.stats.reset_counts()
    with _host_sync_forbidden():
        lm.target.forward(rows, 4)
        lm.target.forward(rows[:, :1], 7)
    assert lm.cache.stats()["total"]["acquires"] == 0
    if graphs:
        assert lm.graph_stats()["target"]["replays"] == 2


@pytest.mark.parametrize("name", TINY)
def test_cuda_graph_replays_the_window_forward_bit_for_bit(name):
    lm = load_model(name, device="cuda", dtype=torch.float16, seed=6)  # all resident, graphs on
    assert lm.cuda_graphs
    generator = torch.Generator("cuda").manual_seed(2)
    prompt = torch.randint(0, lm.config.vocab_size, (1, 40), device="cuda", generator=generator)
    for role, count in (("target", 3), ("draft", 1)):
        adapter = getattr(lm, role)
        rows = torch.randint(0, lm.config.vocab_size, (1, count), device="cuda")
        results = []
        for _ in range(3):  # window mode eagerly, eagerly then captured, replayed
            lm.reset()
            lm.target.forward(prompt, 0)
            results.append(adapter.forward(rows, 40))
            assert lm.kv.cache.length == 40 + count
        stats = adapter.graphs.stats
        assert stats.disabled_reason is None
        assert (stats.captures, stats.replays) >= (1, 1)
        assert torch.equal(results[2], results[0])
        assert torch.equal(results[1], results[0])


@pytest.mark.parametrize("name", TINY)
@pytest.mark.parametrize("slots", [2, None])
def test_cuda_graphed_speculation_equals_plain_decoding(name, slots):
    lm = load_model(name, device="cuda", dtype=torch.float16, slots_per_layer=slots, seed=7)
    prompt = torch.randint(0, lm.config.vocab_size, (60,), device="cuda").tolist()
    plain = SpecController(None, lm.target, depth=0).generate(prompt, 40)
    for depth in (1, 4):
        lm.reset()
        spec = SpecController(lm.draft, lm.target, cache=lm.prefetcher, depth=depth)
        assert spec.generate(prompt, 40).tokens == plain.tokens
    stats = lm.graph_stats()
    assert stats["draft"]["replays"] > 0
    assert stats["draft"]["disabled_reason"] is None
    if slots is None:
        assert stats["target"]["replays"] > 0
        assert stats["target"]["disabled_reason"] is None
    eager = load_model(
        name, device="cuda", dtype=torch.float16, slots_per_layer=slots, seed=7, cuda_graphs=False
    )
    # Window mode only adds masked (zero) terms to attention's sums: same tokens as eager.
    assert SpecController(None, eager.target, depth=0).generate(prompt, 40).tokens == plain.tokens


@pytest.mark.parametrize("name", TINY)
def test_cuda_graphs_captured_ahead_serve_every_decode_step(name):
    lm = load_model(name, device="cuda", dtype=torch.float16, seed=8, max_seq_len=320)
    captured = lm.capture_step_graphs()
    assert captured["draft"] == 2  # windows 256 and 320, one row
    assert captured["target"] > captured["draft"]
    assert lm.kv.cache.length == 0
    assert int(lm.counter.counts.sum()) == 0
    prompt = torch.randint(0, lm.config.vocab_size, (200,), device="cuda").tolist()
    plain = SpecController(None, lm.target, depth=0).generate(prompt, 48)
    lm.reset()
    spec = SpecController(lm.draft, lm.target, cache=lm.prefetcher, depth=5).generate(prompt, 48)
    assert spec.tokens == plain.tokens
    stats = lm.graph_stats()
    for role in ("target", "draft"):
        assert stats[role]["window_eager"] == 0  # nothing ran outside a graph
        assert stats[role]["graphs"] == captured[role]  # nothing new was captured
        assert stats[role]["replays"] > 0


def test_cuda_capture_compiles_the_greedy_argmax_before_the_first_decode(monkeypatch):
    # The argmax runs on the logits outside the graphs; a fresh machine's first generate
    # compiled it inside its timed decode. Triton's hook sees each kernel's first use in
    # this process (the argmax's in-memory cache is emptied first, so earlier tests'
    # launches do not hide it).
    import triton

    from specter_kernels.sampling.argmax_triton import _argmax_kernel

    lm = load_model("tiny-deepseek-v2", device="cuda", dtype=torch.float16, seed=8, max_seq_len=320)
    _argmax_kernel.device_caches.clear()
    phase, first_uses = ["capture"], []

    def hook(*, fn, **_):
        first_uses.append((phase[0], fn.name))
        return False  # compile as usual

    monkeypatch.setattr(triton.knobs.runtime, "jit_cache_hook", hook)
    lm.capture_step_graphs()
    phase[0] = "decode"
    prompt = torch.randint(0, lm.config.vocab_size, (200,), device="cuda").tolist()
    SpecController(lm.draft, lm.target, cache=lm.prefetcher, depth=4).generate(prompt, 24)
    SpecController(None, lm.target, depth=0).generate(prompt, 8)
    assert ("capture", "_argmax_kernel") in first_uses
    assert ("decode", "_argmax_kernel") not in first_uses


def test_cuda_captures_run_with_the_collector_paused_and_survive_a_collection_of_old_graphs():
    # An earlier model's graphs and events left in a reference cycle: a collection during
    # a capture would tear them down on the capturing thread. Every capture sees the
    # collector off, and all of them succeed.
    import gc

    class Cycle:
        def __init__(self, payload):
            self.payload, self.me = payload, self

    old = load_model("tiny-qwen2-moe", device="cuda", dtype=torch.float16, seed=8, max_seq_len=256)
    old.capture_step_graphs()
    Cycle(old)
    del old
    lm = load_model("tiny-qwen2-moe", device="cuda", dtype=torch.float16, seed=8, max_seq_len=320)
    seen = []

    def observe(module, args):
        if torch.cuda.is_current_stream_capturing():
            seen.append(gc.isenabled())

    handle = lm.model.register_forward_pre_hook(observe)
    try:
        captured = lm.capture_step_graphs()
    finally:
        handle.remove()
    assert seen
    assert not any(seen)
    assert gc.isenabled()
    stats = lm.graph_stats()
    assert stats["target"]["disabled_reason"] is None
    assert stats["draft"]["disabled_reason"] is None
    assert captured["target"] > captured["draft"] == 2
    gc.collect()  # the old cycle goes now, outside any capture


@pytest.mark.parametrize("name", TINY)
def test_cuda_plain_streamed_decode_replays_the_one_row_graphs_captured_past_the_prompt(name):
    # What `specter generate --depth 0` captures under a budget: one-row target graphs of
    # the windows from the prompt on (256 and 320), enough for the whole decode.
    kwargs = {**BUDGETED, "miss_path": "stream", "stream_fills": 8}
    lm = load_model(name, draft=None, **kwargs)
    prompt = torch.randint(0, lm.config.vocab_size, (200,), device="cuda").tolist()
    assert lm.capture_step_graphs(min_length=len(prompt), max_rows=1) == {"target": 2}
    lm.reset()
    plain = SpecController(None, lm.target, depth=0).generate(prompt, 40)
    stats = lm.graph_stats()["target"]
    assert stats["window_eager"] == 0  # every step replayed a graph captured ahead
    assert stats["graphs"] == 2
    assert stats["replays"] >= 39  # a step per token after the first
    assert lm.cache.stats()["total"]["streamed_fills"] > 0
    eager = load_model(name, draft=None, cuda_graphs=False, **kwargs)
    assert SpecController(None, eager.target, depth=0).generate(prompt, 40).tokens == plain.tokens


@pytest.mark.parametrize("name", TINY)
def test_cuda_pipelined_stream_records_keep_plain_tokens_and_fill_no_expert_twice(name):
    # StreamRecord.pipelined: each plain streamed step chooses its fill candidates before
    # the step before it is counted; the graphs replay, the tokens are the ones counting
    # first gives, and the device maps end equal to the host's.
    kwargs = {**BUDGETED, "miss_path": "stream", "stream_fills": 8, "draft": None}
    prompt = torch.randint(0, 96, (200,), device="cuda").tolist()
    runs = []
    for pipelined in (False, True):
        lm = load_model(name, **kwargs)
        lm.runtime.stream_record.pipelined = pipelined
        lm.capture_step_graphs(min_length=len(prompt), max_rows=1)
        lm.reset()
        runs.append(SpecController(None, lm.target, depth=0).generate(prompt, 40).tokens)
        total = lm.cache.stats()["total"]  # settles every count
        assert total["streamed_fills"] > 0
        assert lm.graph_stats()["target"]["window_eager"] == 0
        torch.cuda.synchronize()
        for layer in range(lm.cache.num_layers):
            expected = [lm.cache.slot_of(layer, e) for e in range(lm.cache.num_experts)]
            assert lm.cache.expert_to_slot(layer).tolist() == [
                -1 if s is None else s for s in expected
            ]
    assert runs[1] == runs[0]


@pytest.mark.parametrize("name", TINY)
@pytest.mark.parametrize("verification", ["expert", "token"])
def test_cuda_piecewise_graphs_under_a_budget_decode_like_eager(name, verification):
    kwargs = {**BUDGETED, "verification": verification}
    lm = load_model(name, **kwargs)  # piecewise graphs come with CUDA graphs by default
    captured = lm.capture_step_graphs()
    assert captured["target"] > 0
    prompt = torch.randint(0, lm.config.vocab_size, (200,), device="cuda").tolist()
    plain = SpecController(None, lm.target, depth=0).generate(prompt, 32)
    lm.reset()
    spec = SpecController(lm.draft, lm.target, cache=lm.prefetcher, depth=5).generate(prompt, 32)
    assert spec.tokens == plain.tokens
    stats = lm.graph_stats()["target"]
    assert stats["disabled_reason"] is None
    assert stats["window_eager"] == 0  # every target step replayed its pieces
    assert stats["replays"] > 0
    assert stats["piecewise_graphs"] == stats["graphs"]
    eager = load_model(name, cuda_graphs=False, **kwargs)
    assert SpecController(None, eager.target, depth=0).generate(prompt, 32).tokens == plain.tokens


def test_cuda_piecewise_captures_record_on_one_stream(monkeypatch):
    # cuBLAS keeps a 32 MiB workspace per stream it runs on: a stream a capture cost
    # DeepSeek-V2-Lite's draftless 24 GB load 33 workspaces, 1.1 GB past its plan.
    lm = load_model("tiny-deepseek-v2", **BUDGETED)
    made = []
    real = torch.cuda.Stream

    def counting(*args, **kwargs):
        stream = real(*args, **kwargs)
        if "stream_id" not in kwargs:  # a new stream, not current_stream()'s wrapper of one
            made.append(stream)
        return stream

    monkeypatch.setattr(torch.cuda, "Stream", counting)
    captured = lm.capture_step_graphs()
    assert captured["target"] >= 3
    assert lm.graph_stats()["target"]["piecewise_graphs"] == captured["target"]
    # The graphs' one capture stream (and torch.cuda.graph's own, made once a process).
    assert len(made) <= 2
    assert lm.target.graphs.capture_stream() is lm.target.graphs.capture_stream()


@pytest.mark.parametrize("name", ["tiny-deepseek-v2", "tiny-qwen2-moe"])
def test_cuda_fused_rms_norm_computes_transformers_norms(name):
    kwargs = {"device": "cuda", "dtype": torch.float16, "seed": 10, "cuda_graphs": False}
    fused = load_model(name, **kwargs)
    plain = load_model(name, fused_norms=False, **kwargs)
    prompt = torch.randint(0, fused.config.vocab_size, (1, 24), device="cuda")
    a = fused.target.forward(prompt, 0).float()
    b = plain.target.forward(prompt, 0).float()
    assert (a - b).abs().max() <= 0.02 * b.abs().max()


@pytest.mark.parametrize("name", TINY)
def test_cuda_row_truncation_under_piecewise_graphs_keeps_greedy_tokens(name):
    kwargs = {
        "device": "cuda", "dtype": torch.float16, "slots_per_layer": 2, "seed": 12,
        "max_seq_len": 320,
    }  # fmt: skip
    # Misses priced far above tokens: every row bringing a new missing expert is cut.
    policy = RowTruncation(token_seconds=1e-6, bandwidth_bytes_per_s=1.0)
    lm = load_model(name, row_truncation=policy, **kwargs)
    lm.capture_step_graphs()
    prompt = torch.randint(0, lm.config.vocab_size, (200,), device="cuda").tolist()
    plain = SpecController(None, lm.target, depth=0).generate(prompt, 32)
    lm.reset()
    spec = SpecController(lm.draft, lm.target, cache=lm.prefetcher, depth=5).generate(prompt, 32)
    assert spec.tokens == plain.tokens
    assert spec.stats.verified < spec.stats.proposed  # rows were cut
    assert lm.graph_stats()["target"]["piecewise_graphs"] > 0


@pytest.mark.parametrize("name", TINY)
def test_cuda_fused_rotary_computes_transformers_rotary(name):
    kwargs = {"device": "cuda", "dtype": torch.float16, "seed": 13, "cuda_graphs": False}
    fused = load_model(name, **kwargs)
    plain = load_model(name, fused_rotary=False, **kwargs)
    assert any(getattr(m, "_specter_fused_rotary", False) for m in fused.model.modules())
    prompt = torch.randint(0, fused.config.vocab_size, (1, 24), device="cuda")
    a = fused.target.forward(prompt, 0).float()
    b = plain.target.forward(prompt, 0).float()
    assert (a - b).abs().max() <= 0.02 * b.abs().max()


@pytest.mark.parametrize("pruned", [False, True], ids=["hot", "hot-and-pruned"])
@pytest.mark.parametrize("name", TINY)
def test_cuda_hot_set_draft_is_graphed_sync_free_and_speculation_exact(name, pruned):
    # A pinned hot set at a budget (and a pruned draft: experts 0 and 3 skipped): the draft's
    # steps (skip-pairs INT4 kernel plus the grouped FP16 kernel on the pinned slots) replay
    # as graphs with no host sync, give the eager window forward's logits, and greedy
    # speculation keeps plain decoding's tokens.
    lm = load_model(name, device="cuda", dtype=torch.float16, slots_per_layer=4, seed=6)
    hot = [[1, 6]] * lm.cache.num_layers
    skip = [[0, 3]] * lm.cache.num_layers if pruned else None
    kwargs = {"device": "cuda", "dtype": torch.float16, "slots_per_layer": 4, "seed": 6,
              "hot_experts": hot, "draft_pruned_experts": skip}  # fmt: skip
    lm = load_model(name, **kwargs)
    assert lm.hot_experts == hot
    assert lm.draft_pruned_experts == (skip or [[] for _ in hot])
    generator = torch.Generator("cuda").manual_seed(8)
    prompt = torch.randint(0, lm.config.vocab_size, (1, 6), device="cuda", generator=generator)
    lm.target.forward(prompt, 0)
    token = prompt[:, -1:]
    eager = load_model(name, cuda_graphs=False, **kwargs)
    eager.target.forward(prompt, 0)
    for _ in range(2):  # warm-up: kernels compiled, the step's graph captured
        lm.draft.forward(token, 6)
        lm.draft.truncate(6)
    lm.draft.graphs.stats.reset_counts()
    with _host_sync_forbidden():
        graphed = lm.draft.forward(token, 6)
    assert lm.graph_stats()["draft"]["replays"] == 1
    expected = eager.draft.forward(token, 6)
    assert (graphed.float() - expected.float()).abs().max() < 0.01 * expected.float().abs().max()
    lm.reset()
    plain = SpecController(None, lm.target, depth=0).generate(prompt[0].tolist(), 32)
    lm.reset()
    spec = SpecController(lm.draft, lm.target, cache=lm.prefetcher, depth=4)
    assert spec.generate(prompt[0].tolist(), 32).tokens == plain.tokens
    assert lm.hot_experts == hot


@pytest.mark.parametrize("name", TINY)
def test_cuda_streamed_misses_graph_the_budgeted_target_whole_and_keep_greedy_tokens(name):
    # miss_path="stream": a budgeted verification reads missing experts in place from the
    # pinned store, so it is one graph (no pieces), replayed with no host sync, and its
    # greedy tokens are the acquire path's.
    kwargs = dict(BUDGETED)
    prompt = torch.randint(0, 96, (200,), device="cuda").tolist()
    acquired = SpecController(None, load_model(name, **kwargs).target, depth=0).generate(prompt, 32)
    lm = load_model(name, miss_path="stream", stream_fills=8, **kwargs)
    plain = SpecController(None, lm.target, depth=0).generate(prompt, 32)
    assert plain.tokens == acquired.tokens
    assert lm.cache.stats()["total"]["streamed_fills"] > 0  # fills kept streamed experts
    lm.reset()
    spec = SpecController(lm.draft, lm.target, cache=lm.prefetcher, depth=5).generate(prompt, 32)
    assert spec.tokens == plain.tokens
    stats = lm.graph_stats()["target"]
    assert stats["disabled_reason"] is None
    assert stats["replays"] > 0
    assert stats["piecewise_graphs"] == 0
    total = lm.cache.stats()["total"]
    assert total["streamed_reads"] > 0
    assert total["prefetch_loads"] > 0
    torch.cuda.synchronize()
    for layer in range(lm.cache.num_layers):  # the device map is the host's, fills included
        expected_map = [lm.cache.slot_of(layer, e) for e in range(lm.cache.num_experts)]
        assert lm.cache.expert_to_slot(layer).tolist() == expected_map
    rows = torch.tensor([[5, 6, 7]], device="cuda")
    start = lm.target.kv_length
    record = lm.runtime.stream_record
    for _ in range(2):  # the key's graph is captured, then replayed
        lm.target.forward(rows, start)
        lm.target.truncate(start)
    expected = lm.target.forward(rows, start)
    lm.target.truncate(start)
    lm.kv.cache.crop_to(start)
    with _host_sync_forbidden(), record.forward(lm.cache, 3, count=False):
        replayed = lm.target.graphs.forward(rows, start)
    assert torch.equal(replayed, expected)


@pytest.mark.parametrize("name", TINY)
def test_cuda_staged_streaming_keeps_greedy_tokens_and_the_whole_graph(name):
    # stream_staging: each layer's first missing experts are copied into the staging buffer
    # inside the verification's graph, then read there; tokens and bytes are plain
    # streaming's, and both widths are graphed whole in one process.
    kwargs = {**BUDGETED, "miss_path": "stream"}
    prompt = torch.randint(0, 96, (200,), device="cuda").tolist()
    lm = load_model(name, stream_staging=4, **kwargs)
    runs = {}
    for staging in (0, 4, 0):
        lm.stream_staging = staging
        lm.reset()
        spec = SpecController(lm.draft, lm.target, cache=lm.prefetcher, depth=5)
        tokens = spec.generate(prompt, 32).tokens
        total = lm.cache.stats()["total"]
        runs.setdefault(staging, []).append((tokens, total["streamed_reads"]))
        assert total["streamed_reads"] > 0
    assert runs[4][0][0] == runs[0][0][0] == runs[0][1][0]
    stats = lm.graph_stats()["target"]
    assert stats["disabled_reason"] is None
    assert stats["piecewise_graphs"] == 0
    assert {key[4] for key in lm.target.graphs.stats.keys} == {0, 4}
    assert {key[4] for key in lm.draft.graphs.stats.keys} == {0}  # the draft never stages
    torch.cuda.synchronize()
    staged = [e for e in lm.runtime.staging.staged_experts.tolist() if e >= 0]
    assert len(staged) == len(set(staged))


def _rows_eager_captured_replayed(lm, prompt: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """The target's logits of ``rows`` after ``prompt``: eagerly, then captured, then replayed,
    checked equal bit for bit (each run truncated back to the prompt)."""
    start = prompt.shape[1]
    lm.target.forward(prompt, 0)
    logits = []
    for _ in range(3):
        logits.append(lm.target.forward(rows, start))
        lm.target.truncate(start)
    assert torch.equal(logits[1], logits[0])
    assert torch.equal(logits[2], logits[0])
    return logits[0]


BUDGETS = pytest.mark.parametrize(
    "budget",
    [{}, {"slots_per_layer": 2}, {"slots_per_layer": 2, "miss_path": "stream"}],
    ids=["resident", "piecewise", "streamed"],
)
"""Every expert resident, two slots per layer with piecewise graphs, and the streamed path."""


def _tiny_problem(budget: dict, seed: int) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """``(load kwargs, a [1, 40] prompt, three rows)`` of the tiny models' CUDA bit tests."""
    kwargs = {"device": "cuda", "dtype": torch.float16, "seed": 5, "max_seq_len": 320, **budget}
    prompt = torch.randint(
        0, 96, (1, 40), device="cuda", generator=torch.Generator("cuda").manual_seed(seed)
    )
    return kwargs, prompt, torch.tensor([[5, 6, 7]], device="cuda")


def _logits_and_greedy(lm, prompt: torch.Tensor, rows: torch.Tensor) -> tuple[torch.Tensor, list]:
    """The rows' logits (:func:`_rows_eager_captured_replayed`), then after a reset the
    speculative (K = 4) greedy tokens of 24 steps after ``prompt``."""
    logits = _rows_eager_captured_replayed(lm, prompt, rows)
    lm.reset()
    spec = SpecController(lm.draft, lm.target, cache=lm.prefetcher, depth=4)
    return logits, spec.generate(prompt[0].tolist(), 24).tokens


@pytest.mark.parametrize("name", ["tiny-deepseek-v2", "tiny-qwen2-moe"])
@BUDGETS
def test_cuda_shared_overlap_keeps_every_bit(name, budget):
    # The shared experts on a side stream in whole-forward captures (in order in eager
    # forwards and piecewise captures): the same logits bit for bit and the same greedy
    # tokens as in order.
    kwargs, prompt, rows = _tiny_problem(budget, seed=4)
    out, tokens = {}, {}
    for overlap in (False, True):
        lm = load_model(name, shared_overlap=overlap, **kwargs)
        out[overlap], tokens[overlap] = _logits_and_greedy(lm, prompt, rows)
        stats = lm.graph_stats()
        assert stats["draft"]["disabled_reason"] is None
        assert stats["target"]["disabled_reason"] is None
        assert (lm.shared_overlap.forks > 0) == overlap  # the draft's steps fork at least
    assert torch.equal(out[True], out[False])
    assert tokens[True] == tokens[False]


@pytest.mark.parametrize("name", ["tiny-deepseek-v2", "tiny-qwen2-moe"])
def test_cuda_split_k_gemms_keep_the_graphs_with_the_overlap(name, monkeypatch):
    # The full-size shapes' tuned tiles split K (the tiny ones' heuristic does not): with every
    # invariant GEMM split, the target and the draft must still be captured (the capture's
    # stream and the side stream make no counters) and give the in-order bits.
    from specter_kernels.invariant import matmul_triton as kernel
    from specter_kernels.invariant.matmul_config import BLOCK_M, MatmulConfig

    def split_everything(N, K, dtype, device_name=None):
        return MatmulConfig(BLOCK_M, 16, 16, split_k=2)

    monkeypatch.setattr(kernel, "matmul_config", split_everything)
    prompt = torch.randint(
        0, 96, (1, 30), device="cuda", generator=torch.Generator("cuda").manual_seed(8)
    )
    rows = torch.tensor([[3, 4]], device="cuda")
    out = {}
    for overlap in (False, True):
        lm = load_model(name, device="cuda", dtype=torch.float16, seed=3, shared_overlap=overlap)
        out[overlap] = _rows_eager_captured_replayed(lm, prompt, rows)
        for _ in range(3):
            lm.draft.forward(rows[:, :1], 30)
            lm.draft.truncate(30)
        stats = lm.graph_stats()
        assert stats["target"]["disabled_reason"] is None
        assert stats["target"]["replays"] > 0
        assert stats["draft"]["disabled_reason"] is None
    assert torch.equal(out[True], out[False])


@BUDGETS
def test_cuda_mla_prologue_keeps_every_bit(budget, monkeypatch):
    # DeepSeek-V2's latent norm, rotations and cache writes in one launch: the same logits bit
    # for bit (eager prefill, captured and replayed steps) and the same greedy tokens as the
    # parts apart (the path of tensors the prologue does not take); the cache holds the same
    # rows.
    from specter_models import absorbed_mla

    kwargs, prompt, rows = _tiny_problem(budget, seed=6)
    out, tokens, caches, launches = {}, {}, {}, {}
    calls = []
    real = absorbed_mla.mla_prologue
    monkeypatch.setattr(absorbed_mla, "mla_prologue", lambda *a: calls.append(1) or real(*a))
    real_layer = absorbed_mla._prologue_layer
    for fused in (False, True):
        apart = (lambda *a: None) if not fused else real_layer
        monkeypatch.setattr(absorbed_mla, "_prologue_layer", apart)
        lm = load_model("tiny-deepseek-v2", **kwargs)
        before = len(calls)
        out[fused], tokens[fused] = _logits_and_greedy(lm, prompt, rows)
        n = lm.target.kv_length
        layer = lm.target.kv.cache.layers[0]
        caches[fused] = (layer.keys[..., :n, :].clone(), layer.values[..., :n, :].clone())
        launches[fused] = len(calls) - before
    assert launches[False] == 0
    assert launches[True] > 0
    assert torch.equal(out[True], out[False])
    assert tokens[True] == tokens[False]
    for fused_rows, apart_rows in zip(caches[True], caches[False], strict=True):
        assert torch.equal(fused_rows, apart_rows)


@pytest.mark.parametrize("name", ["tiny-deepseek-v2", "tiny-qwen2-moe"])
@BUDGETS
def test_cuda_fused_residuals_keep_every_bit(name, budget, monkeypatch):
    # The attention's residual add in the post-attention norm and the MoE block's branch add
    # in the layer's: the same logits bit for bit (eager prefill, captured and replayed steps)
    # and the same greedy tokens as the adds apart (transformers' layer forward), with the
    # shared experts' side stream.
    from specter_models import fused_residuals

    kwargs, prompt, rows = _tiny_problem(budget, seed=6)
    out, tokens, launches = {}, {}, {}
    calls = []
    real = fused_residuals.add_rms_norm
    monkeypatch.setattr(fused_residuals, "add_rms_norm", lambda *a: calls.append(1) or real(*a))
    for fused in (False, True):
        lm = load_model(name, fused_residuals=fused, **kwargs)
        before = len(calls)
        out[fused], tokens[fused] = _logits_and_greedy(lm, prompt, rows)
        launches[fused] = len(calls) - before
        assert lm.graph_stats()["target"]["disabled_reason"] is None
    assert launches[False] == 0
    assert launches[True] > 0
    assert torch.equal(out[True], out[False])
    assert tokens[True] == tokens[False]


@BUDGETS
def test_cuda_fused_value_projection_is_close_and_speculation_stays_exact(budget, monkeypatch):
    # DeepSeek-V2's W_UV product inside the attention's merge kernel: logits close to the
    # separate bmm's (another summation order), eager, captured and replayed rows equal, a
    # row verified with others equal to the row alone, and speculative greedy tokens equal
    # to plain greedy tokens.
    calls = _mla_fusion_against_apart(
        budget, monkeypatch, ("fused_value_projection", lambda q_lat: False), "mla_attention", len
    )
    for fused in (False, True):
        assert bool(calls[fused])
        assert all(n == (7 if fused else 6) for n in calls[fused])


@BUDGETS
def test_cuda_queries_absorbed_in_the_prologue_are_close_and_speculation_stays_exact(
    budget, monkeypatch
):
    # q_lat computed by the prologue's launch in decode and
    # verification steps (the prefill keeps the bmm): logits close to the bmm's (another
    # summation order), rows verified together equal to each alone, speculative greedy
    # tokens equal to plain greedy tokens.
    from specter_models import absorbed_mla

    calls = _mla_fusion_against_apart(
        budget, monkeypatch, ("ABSORB_MAX_ROWS", 0), "mla_prologue_absorb", lambda a: a[0].shape[0]
    )
    for fused in (False, True):
        assert bool(calls[fused]) is fused
        assert all(t <= absorbed_mla.ABSORB_MAX_ROWS for t in calls[fused])


def _mla_fusion_against_apart(budget, monkeypatch, apart, kernel, note) -> dict[bool, list]:
    """The tiny DeepSeek-V2's target with ``absorbed_mla``'s ``apart = (name, value)`` set
    (the fusion off) and as shipped (on): logits of
    rows eager, captured and replayed (equal), close between the two; with it on, rows
    invariant and speculation exact. Returns ``note(args)`` of each call of
    ``absorbed_mla.<kernel>`` per setting."""
    from specter_models import absorbed_mla

    kwargs, prompt, rows = _tiny_problem(budget, seed=9)
    calls: list = []
    real = getattr(absorbed_mla, kernel)
    monkeypatch.setattr(absorbed_mla, kernel, lambda *a: calls.append(note(a)) or real(*a))
    out, per_setting = {}, {}
    name, off = apart
    shipped = getattr(absorbed_mla, name)
    for fused in (False, True):
        monkeypatch.setattr(absorbed_mla, name, shipped if fused else off)
        lm = load_model("tiny-deepseek-v2", **kwargs)
        calls.clear()
        out[fused] = _rows_eager_captured_replayed(lm, prompt, rows).float()
        per_setting[fused] = list(calls)
    assert (out[True] - out[False]).abs().max() < 0.02 * out[False].abs().max()
    # Rows verified together equal each row alone after the rows before it, and speculative
    # greedy tokens equal plain greedy tokens.
    lm.reset()
    lm.target.forward(prompt, 0)
    together = lm.target.forward(rows, 40)
    lm.target.truncate(40)
    for i in range(rows.shape[1]):
        alone = lm.target.forward(rows[:, i : i + 1], 40 + i)
        assert torch.equal(alone[:, -1], together[:, i])
    lm.reset()
    tokens = prompt[0, :20].tolist()
    spec = SpecController(lm.draft, lm.target, cache=lm.prefetcher, depth=4).generate(tokens, 24)
    plain = SpecController(None, lm.target, depth=0).generate(tokens, 24)
    assert spec.tokens == plain.tokens
    return per_setting


@pytest.mark.parametrize("name", TINY)
def test_cuda_layerwise_final_plans_come_from_the_graphed_draft_and_keep_tokens(name):
    # Under a budget on CUDA the loader makes the draft publish its counts (one launch per
    # layer, inside the draft's graphs): its layer-wise prefetcher then plans every final
    # boundary from the rows as they arrive, with no fallback, and the tokens stay plain
    # decoding's.
    kwargs = {**BUDGETED, "miss_path": "stream"}
    prompt = torch.randint(0, 96, (120,), device="cuda").tolist()
    lm = load_model(name, **kwargs)
    assert lm.counter.publishing
    assert lm.prefetcher.layerwise  # the default where the counter publishes
    plain = SpecController(None, lm.target, depth=0).generate(prompt, 24)
    lm.reset()
    # Depth 1: the draft's one token is its last, so every draft plans layer by layer (at
    # deeper drafts an earlier boundary may fill the free slots and end the predicting).
    spec = SpecController(lm.draft, lm.target, cache=lm.prefetcher, depth=1).generate(prompt, 24)
    assert spec.tokens == plain.tokens
    stats = lm.prefetcher.stats()
    assert stats["layerwise_boundaries"] > 0
    assert stats["layerwise_fallbacks"] == 0
    assert stats["prefetch_issued"] > 0
    assert lm.graph_stats()["draft"]["replays"] > 0


@pytest.mark.parametrize("name", TINY)
def test_cuda_stream_waits_are_graphed_and_keep_tokens(name):
    # With stream_waits each streamed verification's graph waits per layer on the cache's
    # landing events (captured once, re-recorded by every prefetch): the tokens stay plain
    # decoding's, the target stays graphed whole, and both switch values get their graphs.
    kwargs = {**BUDGETED, "miss_path": "stream"}
    prompt = torch.randint(0, 96, (120,), device="cuda").tolist()
    lm = load_model(name, stream_waits=True, **kwargs)
    plain = SpecController(None, lm.target, depth=0).generate(prompt, 24)
    runs = {}
    for waits in (True, False, True):
        lm.stream_waits = waits
        lm.reset()
        spec = SpecController(lm.draft, lm.target, cache=lm.prefetcher, depth=2)
        runs.setdefault(waits, []).append(spec.generate(prompt, 24).tokens)
        assert lm.cache.stats()["total"]["prefetch_loads"] > 0
    assert runs[True][0] == runs[True][1] == runs[False][0] == plain.tokens
    stats = lm.graph_stats()["target"]
    assert stats["disabled_reason"] is None
    assert stats["piecewise_graphs"] == 0
    assert {key[5] for key in lm.target.graphs.stats.keys} == {False, True}
    assert {key[5] for key in lm.draft.graphs.stats.keys} == {False}  # the draft never waits
