"""Window-mode steps (what CUDA graphs record), run eagerly on the CPU: they must compute
what the plain forward computes, hide stale KV rows, keep the KV contract, and apply to the
target only when its forward has no host decision in it."""

from __future__ import annotations

import pytest
import torch

from model_helpers import random_prompt
from specter_models.loader import load_model
from specter_models.step_graphs import ROW_BUCKETS, StepGraphs, window_mask


def _load(source, **kwargs):
    return load_model(source, device="cpu", dtype=torch.float64, **kwargs)


def _spoil_rows_beyond(lm, length: int) -> None:
    """Fill every cached row past ``length`` with large values: stale rows a window visits."""
    for layer in lm.kv.cache.layers:
        layer.keys[:, :, length:] = 50.0
        layer.values[:, :, length:] = -50.0


@pytest.mark.parametrize(
    ("role", "count"), [("target", 3), ("target", 9), ("draft", 1)], ids=["3", "9-padded", "draft"]
)
def test_window_mode_computes_the_plain_forward(checkpoints, arch_name, role, count):
    prompt = random_prompt(7, 96, seed=3)
    rows = random_prompt(count, 96, seed=4)
    results = []
    for windowed in (False, True):
        lm = _load(checkpoints[arch_name])  # every expert resident: the target applies
        lm.target.forward(prompt, 0)
        if windowed:
            lm.enable_step_graphs(capture=False, window_step=4)
            _spoil_rows_beyond(lm, prompt.shape[1])
        adapter = getattr(lm, role)
        logits = adapter.forward(rows, prompt.shape[1])
        end = prompt.shape[1] + rows.shape[1]
        assert lm.kv.cache.length == end
        kv = [(layer.keys[:, :, :end].clone(), layer.values[:, :, :end].clone())
              for layer in lm.kv.cache.layers]  # fmt: skip
        results.append((logits, kv))
        if windowed:
            assert adapter.graphs.stats.window_eager == 1, "the step must have run windowed"
    (plain, plain_kv), (windowed, windowed_kv) = results
    torch.testing.assert_close(windowed, plain, rtol=1e-12, atol=1e-12)
    for (k0, v0), (k1, v1) in zip(plain_kv, windowed_kv, strict=True):
        torch.testing.assert_close(k1, k0, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(v1, v0, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("budget", [None, 3], ids=["all-resident", "three-slots"])
def test_generation_is_unchanged_by_window_steps(checkpoints, budget):
    source = checkpoints["tiny-deepseek-v2"]
    prompt = random_prompt(6, 96, seed=8)[0].tolist()
    plain = _load(source, slots_per_layer=budget).generate(prompt, 20, depth=3)
    lm = _load(source, slots_per_layer=budget)
    lm.enable_step_graphs(capture=False, window_step=8)
    windowed = lm.generate(prompt, 20, depth=3)
    assert windowed.tokens == plain.tokens
    plain_deep = _load(source, slots_per_layer=budget).generate(prompt, 20, depth=10)
    assert lm.generate(prompt, 20, depth=10).tokens == plain_deep.tokens  # 11 rows pad to 12
    stats = lm.graph_stats()
    assert stats["draft"]["window_eager"] > 0
    if budget is None:
        assert stats["target"]["window_eager"] > 0
    else:  # under a budget each layer's cache bookkeeping is a host decision: plain forward
        assert stats["target"]["window_eager"] == 0


def test_target_window_mode_needs_every_expert_resident_and_no_trace(checkpoints):
    lm = _load(checkpoints["tiny-qwen2-moe"])
    lm.enable_step_graphs(capture=False)
    graphs = lm.target.graphs
    assert graphs.applies(1)
    assert graphs.applies(lm.max_verify_rows)
    assert not graphs.applies(lm.max_verify_rows + 1)
    lm.verification = "token"  # all resident: nothing to load, the same single wave
    assert graphs.applies(1)
    lm.verification = "expert"
    lm.runtime.record_routing()
    assert not graphs.applies(1)
    lm.runtime.record_routing(False)
    assert graphs.applies(1)
    assert lm.draft.graphs.applies(1)
    assert not lm.draft.graphs.applies(2)


def test_window_rounds_up_to_the_step_and_stops_at_max_seq_len(checkpoints):
    lm = _load(checkpoints["tiny-phimoe"], max_seq_len=40)
    lm.enable_step_graphs(capture=False, window_step=16)
    graphs = lm.target.graphs
    assert [graphs.window_for(end) for end in (1, 16, 17, 33, 40)] == [16, 16, 32, 40, 40]


def test_window_mask_hides_keys_past_each_query():
    positions = torch.tensor([2, 3])
    keys = torch.arange(6)
    boolean = window_mask(positions, keys, "bool", torch.float16)
    assert boolean.shape == (1, 1, 2, 6)
    assert boolean[0, 0].tolist() == [[True] * 3 + [False] * 3, [True] * 4 + [False] * 2]
    additive = window_mask(positions, keys, "additive", torch.float16)
    assert additive.dtype == torch.float16
    assert torch.equal(additive[0, 0] == 0, boolean[0, 0])
    assert (additive[0, 0][~boolean[0, 0]] == torch.finfo(torch.float16).min).all()


def test_reset_zeroes_the_counts_and_disable_restores_the_plain_forward(checkpoints):
    lm = _load(checkpoints["tiny-deepseek-v2"])
    lm.enable_step_graphs(capture=False)
    lm.generate([3, 4, 5], 6, depth=2)
    assert lm.graph_stats()["target"]["window_eager"] > 0
    lm.reset()
    assert lm.graph_stats()["target"]["window_eager"] == 0
    assert lm.cuda_graphs is False  # window mode without capture is not CUDA graphs
    lm.disable_step_graphs()
    assert lm.graph_stats() == {"target": None, "draft": None}


def test_capture_needs_a_cuda_model(checkpoints):
    lm = _load(checkpoints["tiny-qwen2-moe"])
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA model"):
        lm.enable_step_graphs(capture=True)
    with pytest.raises(ValueError, match="cuda_graphs=True needs a CUDA device"):
        _load(checkpoints["tiny-qwen2-moe"], cuda_graphs=True)
    with pytest.raises(ValueError, match="max_rows and window_step must be positive"):
        StepGraphs(lm.model, lm.runtime, lm.kv.cache, lm.target.mode, max_rows=0, capture=False)


def test_unsupported_attention_implementation_is_refused(checkpoints):
    lm = _load(checkpoints["tiny-qwen2-moe"])
    lm.model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="flash_attention_2"):
        lm.enable_step_graphs(capture=False)


def test_rows_pad_to_buckets_within_max_seq_len(checkpoints):
    lm = _load(checkpoints["tiny-qwen2-moe"], max_seq_len=64)
    lm.enable_step_graphs(capture=False)
    graphs = lm.target.graphs
    assert [graphs.padded_rows(n, 0) for n in (1, 5, 9, 13, 17, 25, 33)] == [
        1, 5, 12, 16, 24, 32, 33,
    ]  # fmt: skip
    assert graphs.padded_rows(9, 60) == 9  # 12 rows would run past max_seq_len=64
    assert lm.draft.graphs.padded_rows(1, 0) == 1


def test_capturing_ahead_needs_cuda_graphs(checkpoints):
    lm = _load(checkpoints["tiny-deepseek-v2"])
    with pytest.raises(RuntimeError, match="CUDA graphs are off"):
        lm.capture_step_graphs()
    lm.enable_step_graphs(capture=False)
    with pytest.raises(RuntimeError, match="capture=True"):
        lm.target.graphs.capture_ahead()


def test_capturing_ahead_visits_the_windows_and_rows_asked_for(checkpoints, monkeypatch):
    # Capture runs on CUDA only; here each capture's forward is recorded instead of run, so
    # the windows and row buckets capture_ahead visits can be checked on the CPU.
    lm = _load(checkpoints["tiny-deepseek-v2"], max_seq_len=600)
    lm.enable_step_graphs(capture=False)
    graphs = lm.target.graphs
    graphs.capture = True  # what a CUDA model has; nothing is captured below
    visited = []
    monkeypatch.setattr(
        graphs,
        "forward",
        lambda ids, start: visited.append((start + ids.shape[1], ids.shape[1])),
    )
    assert graphs.capture_ahead() == 0  # nothing captured: the forwards were recorded
    every = list(visited)
    windows = sorted({end for end, _ in every})
    assert windows == [256, 512, 600]  # every window up to max_seq_len, the last one cut
    assert sorted({rows for _, rows in every}) == sorted(
        {min(b, graphs.max_rows) for b in (*ROW_BUCKETS, graphs.max_rows)}
    )
    visited.clear()
    graphs.capture_ahead(520, min_end=300, max_rows=1)  # a plain decode from 299 positions
    assert visited == [(512, 1), (600, 1)]
    visited.clear()
    graphs.capture_ahead(min_end=513, max_rows=3)
    assert visited == [(600, 1), (600, 2), (600, 3)]
    for bad in ({"min_end": 0}, {"max_rows": 0}, {"max_rows": True}, {"min_end": 2.5}):
        with pytest.raises(ValueError, match="must be a positive int"):
            graphs.capture_ahead(**bad)
    with pytest.raises(ValueError, match="past max_end"):
        graphs.capture_ahead(100, min_end=101)
    assert lm.kv.cache.get_seq_length() == 0  # cropped back after the capturing forwards


def test_capturing_ahead_hands_each_forwards_logits_to_on_logits(checkpoints, monkeypatch):
    lm = _load(checkpoints["tiny-deepseek-v2"], max_seq_len=600)
    lm.enable_step_graphs(capture=False)
    graphs = lm.target.graphs
    graphs.capture = True
    monkeypatch.setattr(
        graphs, "forward", lambda ids, start: torch.full((1, ids.shape[1], 5), float(start))
    )
    seen = []
    graphs.capture_ahead(min_end=513, max_rows=3, on_logits=seen.append)
    # one call per capturing forward, with that forward's own logits
    assert [(t.shape[1], t[0, 0, 0].item()) for t in seen] == [(1, 599), (2, 598), (3, 597)]


def test_capture_step_graphs_runs_each_roles_argmax_on_its_capturing_logits(
    checkpoints, monkeypatch
):
    # Greedy decoding's argmax runs outside the graphs: capture runs it, so its kernel
    # compiles there and not in the first decode step.
    lm = _load(checkpoints["tiny-deepseek-v2"], max_seq_len=320)
    lm.enable_step_graphs(capture=False)
    vocab = lm.config.vocab_size
    calls = {}
    for role, adapter in (("target", lm.target), ("draft", lm.draft)):
        adapter.graphs.capture = True
        monkeypatch.setattr(
            adapter.graphs,
            "forward",
            lambda ids, start: torch.randn(1, ids.shape[1], vocab),
        )
        real = adapter.argmax

        def recorded(logits, role=role, real=real):
            calls.setdefault(role, []).append(tuple(logits.shape))
            return real(logits)

        monkeypatch.setattr(adapter, "argmax", recorded)
    lm.capture_step_graphs(min_length=300, max_rows=1)
    assert calls == {"target": [(1, 1, vocab)], "draft": [(1, 1, vocab)]}


@pytest.mark.parametrize("verification", ["expert", "token"])
def test_piecewise_window_mode_under_a_budget_keeps_tokens_loads_and_trace(
    checkpoints, arch_name, verification
):
    prompt = random_prompt(6, 96, seed=9)[0].tolist()
    results = []
    for piecewise in (False, True):
        lm = _load(checkpoints[arch_name], slots_per_layer=3, verification=verification)
        if piecewise:
            lm.enable_step_graphs(capture=False, window_step=8, piecewise=True)
        lm.runtime.record_routing()
        # depth 10: 11 verified rows padded to 12, whose routed experts must not be loaded
        tokens = lm.generate(prompt, 16, depth=10).tokens
        results.append((tokens, lm.cache.stats()["total"], lm.runtime.routing_trace))
        if piecewise:
            assert lm.graph_stats()["target"]["window_eager"] > 0
    (plain, plain_cache, plain_trace), (windowed, windowed_cache, windowed_trace) = results
    assert windowed == plain
    assert windowed_trace == plain_trace
    for counter in ("acquires", "hits", "misses", "demand_loads", "prefetch_loads"):
        assert windowed_cache[counter] == plain_cache[counter], counter


def test_piecewise_graphs_need_cuda_graphs(checkpoints):
    with pytest.raises(ValueError, match="piecewise_graphs=True needs CUDA graphs"):
        _load(checkpoints["tiny-qwen2-moe"], piecewise_graphs=True)
    lm = _load(checkpoints["tiny-qwen2-moe"], slots_per_layer=3)
    lm.enable_step_graphs(capture=False)
    assert not lm.target.graphs.applies(1)  # a budget: only piecewise graphs apply
    lm.enable_step_graphs(capture=False, piecewise=True)
    assert lm.target.graphs.applies(1)
    assert not lm.target.graphs.whole()


def test_paused_collection_turns_the_collector_off_inside_and_restores_it():
    import gc

    from specter_models.step_graphs import paused_collection

    assert gc.isenabled()
    with paused_collection():
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError, match="inside"), paused_collection():
        raise RuntimeError("an error inside")
    assert gc.isenabled()  # restored on the error path too
    gc.disable()
    try:
        with paused_collection():
            assert not gc.isenabled()
        assert not gc.isenabled()  # a caller's own pause is left as it was
    finally:
        gc.enable()


def test_a_capture_records_with_the_collector_paused_and_a_failed_one_restores_it(
    checkpoints, monkeypatch
):
    # The recording itself needs CUDA; what _capture wraps around it does not.
    import gc

    lm = _load(checkpoints["tiny-deepseek-v2"])
    lm.enable_step_graphs(capture=False, window_step=4)
    graphs = lm.target.graphs
    graphs._pool = object()  # skip the CUDA pool handle
    seen = []

    def record(key, step, window, end):
        seen.append(gc.isenabled())
        if len(seen) == 2:
            raise RuntimeError("operation failed due to a previous error during capture")
        return torch.zeros(1)

    monkeypatch.setattr(graphs, "_record", record)
    step = type("Step", (), {"logits": None})()
    key = (1, 4, False, True, 0, False)
    graphs._capture(key, step, 4, 1)
    assert seen == [False]
    assert gc.isenabled()
    assert graphs.stats.keys == [key]
    with pytest.warns(RuntimeWarning, match="previous error during capture"):
        graphs._capture((2, 4, False, True, 0, False), step, 4, 2)
    assert seen == [False, False]
    assert gc.isenabled()
    assert "previous error" in graphs.stats.disabled_reason
