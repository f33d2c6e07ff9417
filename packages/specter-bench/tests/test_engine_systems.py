"""Engine systems on tiny models: every system's greedy output equals transformers' own."""

import pytest
import torch

import specter_models
from specter_bench.engine_systems import (
    ENGINE_SYSTEMS,
    DecodeWindow,
    EngineSystemRunner,
    make_depth_policy,
    staging_width,
)
from specter_bench.hf_baseline import HFRunner
from specter_bench.model_loading import FILL_CANDIDATES, STAGING_SLOTS
from specter_bench.unfused_draft import per_expert_w4a16, unfused_draft_kernel
from specter_models import build_reference_model
from specter_models.loader import load_model

ARCHS = ("tiny-deepseek-v2", "tiny-qwen2-moe", "tiny-phimoe")


def _prompt(seed: int, vocab: int, length: int = 9) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (length,), generator=g).tolist()


@pytest.mark.parametrize("arch", ARCHS)
def test_every_engine_system_matches_transformers_greedy(arch):
    # float64 keeps near-tie argmaxes from flipping between summation orders.
    kwargs = {"device": "cpu", "dtype": torch.float64, "seed": 3, "max_seq_len": 64}
    fills = {"stream_fills": FILL_CANDIDATES}  # specter-fill fills
    spec_load = load_model(arch, slots_per_layer=3, policy="predictive", **fills, **kwargs)
    layers = spec_load.cache.num_layers
    hot_load = load_model(
        arch, slots_per_layer=3, policy="predictive", hot_experts=[[0, 5]] * layers, **fills,
        **kwargs,
    )  # fmt: skip
    lru_load = load_model(
        arch, slots_per_layer=3, policy="lru", draft=None, **fills, **kwargs
    )  # specter-plain-fill fills
    reference = build_reference_model(arch, seed=3, device="cpu", dtype=torch.float64)
    prompt = _prompt(1, spec_load.config.vocab_size)
    expected = HFRunner(reference, "hf-default").generate(prompt, 14).tokens
    for name, system in ENGINE_SYSTEMS.items():
        if not system.needs_draft:
            loaded = lru_load
        else:
            loaded = hot_load if system.hot_experts else spec_load
        run = EngineSystemRunner(loaded, system, depth=3).generate(prompt, 14)
        assert run.tokens == expected, name
        assert run.system == name
        assert run.decode_tokens == 14
        assert run.slots_per_layer == [3] * len(run.slots_per_layer)
        assert run.settings["hot_experts_per_layer"] == (2 if loaded is hot_load else 0)
        if system.speculate:
            assert run.generation["proposed"] > 0
            assert run.draft_s is not None
        else:
            assert run.generation["proposed"] == 0
            assert run.draft_s is None
        assert run.settings["verification"] == system.verification
        # One acquire per layer per verification (expert-wise) or per verified row
        # (token-wise); the prefill (expert-wise for every system) is not counted.
        layers = len(run.slots_per_layer)
        gen = run.generation
        rows = gen["proposed"] + gen["iterations"]
        per_layer = rows if system.verification == "token" else gen["iterations"]
        assert run.cache["acquires"] == per_layer * layers, name
        # Decode-only statistics: every decode step needs at least top-k experts per layer.
        cache = run.cache
        assert cache["hits"] + cache["misses"] >= 14 * len(run.slots_per_layer)
        assert (run.prefetcher is not None) == system.prefetch


def test_lru_gets_the_draft_memory_as_slots_at_a_budget():
    config = specter_models.preset_config("tiny-deepseek-v2")
    with_draft = specter_models.plan_memory(config, slots_per_layer=2, dtype=torch.float64)
    budget = (with_draft.expected_peak_bytes + with_draft.draft_int4_bytes) / 1e9
    spec = specter_models.plan_memory(config, budget, dtype=torch.float64)
    lru = specter_models.plan_memory(config, budget, dtype=torch.float64, with_draft=False)
    assert lru.slots_per_layer > spec.slots_per_layer


class _Recorder:
    def __init__(self):
        self.calls = []

    def on_draft_start(self, depth):
        self.calls.append(("draft", depth))

    def on_draft_token(self, index):
        self.calls.append(("token", index))

    def on_verify_start(self, num_tokens):
        self.calls.append(("verify", num_tokens))

    def on_verify_end(self, num_accepted):
        self.calls.append(("end", num_accepted))

    def reset_stats(self):
        self.calls.append(("reset",))


class _Cache:
    def __init__(self):
        self.resets = 0

    def reset_stats(self):
        self.resets += 1


def test_decode_window_resets_once_and_forwards_every_phase():
    cache, inner = _Cache(), _Recorder()
    started = []
    window = DecodeWindow(cache, inner, lambda: started.append(cache.resets))
    window.on_draft_start(2)
    window.on_draft_token(0)
    window.on_verify_start(3)
    window.on_verify_end(1)
    window.on_draft_start(4)
    assert cache.resets == 1
    assert started == [1]  # once, after the counters were zeroed
    assert inner.calls == [
        ("reset",),
        ("draft", 2),
        ("token", 0),
        ("verify", 3),
        ("end", 1),
        ("draft", 4),
    ]
    alone = DecodeWindow(cache, None)
    alone.on_draft_start(0)
    alone.on_verify_start(1)
    assert cache.resets == 2


def test_statistics_cover_the_decode_only():
    loaded = load_model(
        "tiny-qwen2-moe", slots_per_layer=2, device="cpu", dtype=torch.float64, max_seq_len=96,
        policy="lru", draft=None,
    )  # fmt: skip
    prompt = _prompt(4, loaded.config.vocab_size, length=40)
    run = EngineSystemRunner(loaded, ENGINE_SYSTEMS["lru"]).generate(prompt, 5)
    # One acquire per MoE layer per decode step: the 39-token prefill is not counted.
    assert run.cache["acquires"] == 5 * loaded.cache.num_layers


def test_unfused_draft_equals_fused_and_is_restored():
    import specter_models.specter_experts as experts_module
    from specter_kernels import fused_moe_w4a16, quantize_int4

    g = torch.Generator().manual_seed(0)
    E, H, inter, T, k = 6, 64, 32, 5, 2
    w13 = quantize_int4(torch.randn(E, 2 * inter, H, generator=g).half(), 32)
    w2 = quantize_int4(torch.randn(E, H, inter, generator=g).half(), 32)
    x = torch.randn(T, H, generator=g).half()
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)])
    weights = torch.rand(T, k, generator=g).softmax(-1)
    fused = fused_moe_w4a16(x, ids, weights, w13, w2).float()
    unfused = per_expert_w4a16(x, ids, weights, w13, w2).float()
    assert torch.allclose(unfused, fused, rtol=2e-2, atol=2e-2)
    with unfused_draft_kernel():
        assert experts_module.fused_moe_w4a16 is per_expert_w4a16
    assert experts_module.fused_moe_w4a16 is fused_moe_w4a16
    # Step graphs replay the kernel they were captured with: paused for the block.
    loaded = load_model("tiny-qwen2-moe", device="cpu", dtype=torch.float32)
    loaded.enable_step_graphs(capture=False)
    graphs = loaded.draft.graphs
    with unfused_draft_kernel(loaded.draft):
        assert loaded.draft.graphs is None
    assert loaded.draft.graphs is graphs


def test_depth_policies_and_bad_systems():
    assert make_depth_policy(4) == 4
    assert make_depth_policy("auto").choose_depth() >= 0
    with pytest.raises(ValueError, match="depth must be an int >= 0 or 'auto'"):
        make_depth_policy(-1)
    loaded = load_model(
        "tiny-phimoe", device="cpu", dtype=torch.float64, draft=None, max_seq_len=64
    )
    with pytest.raises(ValueError, match="loaded without a draft"):
        EngineSystemRunner(loaded, ENGINE_SYSTEMS["specter"])


def test_unfused_draft_system_runs_the_per_expert_kernel_in_half_precision(monkeypatch):
    # float16 takes the kernels' path (their torch reference on a CPU), where the ablation
    # swaps the fused draft kernel for one call per expert.
    import specter_bench.unfused_draft as unfused

    calls = []

    def counting(*args, **kwargs):
        calls.append(args[1].shape)
        return per_expert_w4a16(*args, **kwargs)

    monkeypatch.setattr(unfused, "per_expert_w4a16", counting)
    loaded = load_model(
        "tiny-qwen2-moe", slots_per_layer=4, device="cpu", dtype=torch.float16, seed=2,
        max_seq_len=64, policy="predictive",
    )  # fmt: skip
    prompt = _prompt(5, loaded.config.vocab_size)
    fused = EngineSystemRunner(loaded, ENGINE_SYSTEMS["specter"], depth=3).generate(prompt, 10)
    assert calls == []
    runner = EngineSystemRunner(loaded, ENGINE_SYSTEMS["specter-unfused-draft"], depth=3)
    per_expert = runner.generate(prompt, 10)
    assert calls  # every draft MoE layer went through the per-expert path
    assert per_expert.tokens == fused.tokens


def test_row_cut_variant_cuts_rows_and_keeps_greedy_output():
    kwargs = {"device": "cpu", "dtype": torch.float64, "seed": 5, "max_seq_len": 64}
    loaded = load_model("tiny-deepseek-v2", slots_per_layer=2, policy="predictive", **kwargs)
    prompt = _prompt(2, loaded.config.vocab_size)
    plain = EngineSystemRunner(loaded, ENGINE_SYSTEMS["specter"], depth=5).generate(prompt, 16)
    runner = EngineSystemRunner(loaded, ENGINE_SYSTEMS["specter-row-cut"], depth=5)
    # Transfers priced far above tokens: every row bringing a new missing expert is cut.
    runner._row_truncation = specter_models.RowTruncation(
        token_seconds=1e-6, bandwidth_bytes_per_s=1.0
    )
    cut = runner.generate(prompt, 16)
    assert cut.tokens == plain.tokens
    assert cut.settings["row_truncation"] is True
    assert plain.settings["row_truncation"] is False
    assert cut.generation["verified"] < cut.generation["proposed"]
    assert plain.generation["verified"] == plain.generation["proposed"]
    # The variant's policy is not left on the model for the systems after it.
    EngineSystemRunner(loaded, ENGINE_SYSTEMS["specter"], depth=5).generate(prompt, 4)
    assert loaded.runtime.row_truncation is None


def test_specter_staged_stages_in_float16_and_keeps_specter_tokens():
    # The staging variant on a float16 model with a staging buffer: it stages (its records
    # say so) and decodes specter's tokens; on a model without a buffer it runs unstaged.
    kwargs = {"device": "cpu", "seed": 3, "max_seq_len": 64, "slots_per_layer": 3}
    loaded = load_model(
        "tiny-deepseek-v2", dtype=torch.float16, batch_invariant=True, policy="predictive",
        stream_staging=STAGING_SLOTS, **kwargs,
    )  # fmt: skip
    prompt = _prompt(4, loaded.config.vocab_size)
    runs = {
        name: EngineSystemRunner(loaded, ENGINE_SYSTEMS[name], depth=3).generate(prompt, 10)
        for name in ("specter", "specter-staged")
    }
    assert runs["specter-staged"].tokens == runs["specter"].tokens
    assert runs["specter"].settings["stream_staging"] == 0
    assert runs["specter-staged"].settings["stream_staging"] == STAGING_SLOTS
    assert runs["specter-staged"].cache["streamed_reads"] > 0
    assert staging_width(loaded) == STAGING_SLOTS
    plain = load_model("tiny-deepseek-v2", dtype=torch.float64, **kwargs)
    assert staging_width(plain) == 0
    run = EngineSystemRunner(plain, ENGINE_SYSTEMS["specter-staged"], depth=3).generate(prompt, 4)
    assert run.settings["stream_staging"] == 0


def test_plain_steps_overlap_only_with_every_expert_resident():
    kwargs = {"device": "cpu", "dtype": torch.float64, "seed": 3, "max_seq_len": 64}
    config = specter_models.preset_config("tiny-qwen2-moe")
    full = load_model("tiny-qwen2-moe", draft=None, policy="lru", **kwargs)
    budgeted = load_model("tiny-qwen2-moe", slots_per_layer=3, draft=None, policy="lru", **kwargs)
    assert full.cache.slots_per_layer[0] == config.num_experts
    assert DecodeWindow(full.cache, None).plain_steps_may_overlap()
    assert not DecodeWindow(budgeted.cache, None).plain_steps_may_overlap()
    # Streamed plain decoding loads nothing between steps: its steps may overlap anywhere.
    assert DecodeWindow(budgeted.cache, None, streamed_plain=True).plain_steps_may_overlap()
    for name, streamed in (
        ("specter-plain", True),
        ("specter-plain-fill", True),
        ("offload", True),
        ("lru", False),
    ):
        runner = EngineSystemRunner(budgeted, ENGINE_SYSTEMS[name])
        assert runner.window.streamed_plain is streamed, name
        assert runner.window.plain_steps_may_overlap() is streamed, name
    reference = build_reference_model("tiny-qwen2-moe", seed=3, device="cpu", dtype=torch.float64)
    prompt = _prompt(2, config.vocab_size)
    expected = HFRunner(reference, "hf-default").generate(prompt, 10).tokens
    runner = EngineSystemRunner(full, ENGINE_SYSTEMS["lru"])
    runner.controller.pipeline_plain = True  # on by default on CUDA only
    queue_plain, queued = runner.controller._queue_plain, []

    def spy(*args, **kwargs):
        queued.append(args[1])  # n: the committed length the step extends
        return queue_plain(*args, **kwargs)

    runner.controller._queue_plain = spy
    run = runner.generate(prompt, 10)
    assert run.tokens == expected
    assert len(queued) == 10  # every decode step went through the queue
    assert run.generation["iterations"] == 10
    assert run.generation["proposed"] == 0


def test_pipelined_records_keep_plain_fill_tokens_and_say_so():
    # offload is specter-plain-fill whose steps choose fill candidates before the step before
    # them is counted (deferred records, as on CUDA): the same tokens, fills made, and the
    # setting in its records; switching back turns it off.
    kwargs = {"device": "cpu", "dtype": torch.float64, "seed": 3, "max_seq_len": 64}
    loaded = load_model(
        "tiny-deepseek-v2", slots_per_layer=3, draft=None, policy="lru", miss_path="stream",
        stream_fills=FILL_CANDIDATES, **kwargs,
    )  # fmt: skip
    loaded.runtime.stream_record.deferred = True  # the CUDA default
    prompt = _prompt(4, loaded.config.vocab_size)
    runs = {}
    for name in ("specter-plain-fill", "offload", "specter-plain-fill"):
        run = EngineSystemRunner(loaded, ENGINE_SYSTEMS[name]).generate(prompt, 12)
        runs.setdefault(name, []).append(run)
    pipe, fill = runs["offload"][0], runs["specter-plain-fill"]
    assert pipe.tokens == fill[0].tokens == fill[1].tokens
    assert pipe.settings["pipelined_records"] is True
    assert [r.settings["pipelined_records"] for r in fill] == [False, False]
    assert pipe.cache["streamed_fills"] > 0


def test_specter_plans_from_published_counts_and_specter_snapshot_keeps_its_tokens():
    # specter plans each draft's final prefetch from the counts the draft publishes layer by
    # layer (the loader publishes on CUDA; here the test turns it on): every final boundary
    # layer-wise, no fallback; specter-snapshot plans from a snapshot, to the same tokens.
    kwargs = {"device": "cpu", "dtype": torch.float64, "seed": 3, "max_seq_len": 64}
    loaded = load_model(
        "tiny-deepseek-v2", slots_per_layer=3, policy="predictive", miss_path="stream", **kwargs
    )
    assert not loaded.counter.publishing  # on the CPU the loader does not publish
    assert not loaded.prefetcher.layerwise
    loaded.counter.publish()
    prompt = _prompt(4, loaded.config.vocab_size)
    runs = {
        name: EngineSystemRunner(loaded, ENGINE_SYSTEMS[name], depth=2).generate(prompt, 12)
        for name in ("specter-snapshot", "specter")
    }
    layered, snap = runs["specter"], runs["specter-snapshot"]
    assert layered.tokens == snap.tokens
    assert layered.settings["layerwise"] is True
    assert snap.settings["layerwise"] is False
    assert layered.prefetcher["layerwise_boundaries"] > 0
    assert layered.prefetcher["layerwise_fallbacks"] == 0
    assert snap.prefetcher["layerwise_boundaries"] == 0
    assert layered.prefetcher["prefetch_issued"] > 0


def test_specter_no_wait_switches_the_waits_off_for_itself_only_and_keeps_tokens():
    kwargs = {"device": "cpu", "dtype": torch.float64, "seed": 3, "max_seq_len": 64}
    loaded = load_model(
        "tiny-qwen2-moe", slots_per_layer=3, policy="predictive", miss_path="stream", **kwargs
    )
    prompt = _prompt(5, loaded.config.vocab_size)
    runs = [
        EngineSystemRunner(loaded, ENGINE_SYSTEMS[name], depth=2).generate(prompt, 10)
        for name in ("specter-no-wait", "specter")
    ]
    no_wait, wait = runs
    assert wait.tokens == no_wait.tokens
    assert wait.settings["stream_waits"] is True
    assert no_wait.settings["stream_waits"] is False
    assert loaded.stream_waits is True  # specter ran last and switched them back on
    assert wait.cache["prefetch_loads"] > 0
    lru = EngineSystemRunner(loaded, ENGINE_SYSTEMS["lru"]).generate(prompt, 4)
    assert lru.settings["stream_waits"] is None  # not on the streamed path


@pytest.mark.parametrize("arch", ["tiny-deepseek-v2", "tiny-qwen2-moe"])
def test_offload_with_a_pinned_hot_set_decodes_what_lru_and_the_target_decode(arch):
    # offload: no draft, streamed misses with fills, pipelined records, and a pinned hot set
    # (here forced: two experts a layer). Greedy tokens equal lru's (misses loaded on demand,
    # no pins) and transformers' own.
    kwargs = {"device": "cpu", "dtype": torch.float64, "seed": 3, "max_seq_len": 64}
    plain = {"draft": None, "policy": "lru", "slots_per_layer": 3, "miss_path": "stream",
             "stream_fills": FILL_CANDIDATES}  # fmt: skip
    lru_load = load_model(arch, **plain, **kwargs)
    layers = lru_load.cache.num_layers
    hot_load = load_model(arch, hot_experts=[[0, 5]] * layers, **plain, **kwargs)
    hot_load.runtime.stream_record.deferred = True  # the CUDA default: records pipeline
    reference = build_reference_model(arch, seed=3, device="cpu", dtype=torch.float64)
    prompt = _prompt(6, lru_load.config.vocab_size)
    expected = HFRunner(reference, "hf-default").generate(prompt, 12).tokens
    offload = EngineSystemRunner(hot_load, ENGINE_SYSTEMS["offload"]).generate(prompt, 12)
    lru = EngineSystemRunner(lru_load, ENGINE_SYSTEMS["lru"]).generate(prompt, 12)
    assert offload.tokens == lru.tokens == expected
    assert offload.settings["hot_experts_per_layer"] == 2
    assert offload.settings["miss_path"] == "stream"
    assert offload.settings["pipelined_records"] is True
    assert offload.settings["speculation"] == "off"
    assert offload.generation["proposed"] == 0
    assert [hot_load.cache.pinned(layer) for layer in range(layers)] == [[0, 5]] * layers
    # What users feel, on the CPU: times positive and in order, no driver to ask.
    for run in (offload, lru):
        assert run.ttft_s > 0
        assert run.started_s > 0
        assert run.prefill_s < run.ttft_s
        assert run.driver_peak_bytes is None
        assert run.run_index == 0
