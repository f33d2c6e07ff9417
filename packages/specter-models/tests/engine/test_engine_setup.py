"""The engine's set-up steps: graph capture, depth warm-up, the hot set's routing."""

import pytest
import torch

import specter_models
from specter_models.loader import load_model
from specter_spec import SpecController


def test_the_decode_graphs_are_captured_before_decoding():
    # On CUDA, generate captures ahead the graphs its steps replay (windows from the prompt
    # on; one row when decoding plainly), then resets the model, so no timed step captures.
    from specter_models.engine.warmup import CAPTURE_AHEAD_POSITIONS, capture_decode_graphs

    class Model:
        cuda_graphs = True

        def __init__(self):
            self.calls = []

        def capture_step_graphs(self, max_length=None, **kwargs):
            self.calls.append(("capture", max_length, kwargs))
            return {"target": 2, "draft": 3} if kwargs["max_rows"] is None else {"target": 1}

        def reset(self):
            self.calls.append(("reset",))

    lines = []
    for speculate, rows, count in ((True, None, 5), (False, 1, 1)):
        model = Model()
        result = capture_decode_graphs(
            model, prompt_length=37, speculate=speculate, log=lines.append
        )
        assert model.calls == [
            ("capture", 37 + CAPTURE_AHEAD_POSITIONS, {"min_length": 37, "max_rows": rows}),
            ("reset",),
        ]
        assert result["graphs_captured"] == count
        assert result["graph_capture_s"] >= 0
    assert f"captured {count} CUDA graphs" in lines[-1]
    Model.cuda_graphs = False
    model = Model()
    assert capture_decode_graphs(model, prompt_length=3, speculate=True) == {
        "graphs_captured": None,
        "graph_capture_s": None,
    }
    assert model.calls == []


def test_depth_warm_up_measures_the_adaptive_depth_then_resets_the_model():
    # With every expert resident, --depth auto decodes some tokens of the prompt first so
    # its AdaptiveDepth starts from measured draft and verify times; nothing else stays.
    from specter_models.engine.decode_window import make_depth_policy
    from specter_models.engine.warmup import warm_adaptive_depth
    from specter_spec import SpecController

    lm = load_model("tiny-deepseek-v2", device="cpu", seed=3, max_seq_len=128)
    ids = torch.randint(0, lm.config.vocab_size, (12,)).tolist()
    policy = make_depth_policy("auto", 4)

    def make(depth=policy):
        return SpecController(lm.draft, lm.target, cache=lm.prefetcher, depth=depth)

    seconds = warm_adaptive_depth(make(), lm, ids, 8, every_expert_resident=True)
    assert seconds is not None
    assert seconds > 0
    assert policy.verify_costs
    assert policy.draft_times
    assert lm.kv.cache.length == 0  # the warm-up's KV rows are gone
    assert int(lm.counter.counts.sum()) == 0
    assert lm.cache.stats()["total"]["hits"] == 0
    # The decode after it gives plain decoding's greedy tokens.
    warmed = SpecController(lm.draft, lm.target, cache=lm.prefetcher, depth=policy)
    tokens = warmed.generate(ids, 10).tokens
    lm.reset()
    assert tokens == SpecController(None, lm.target, depth=0).generate(ids, 10).tokens
    # No warm-up at a fixed depth, under a budget or for no tokens.
    fresh = make_depth_policy("auto", 4)
    for depth, resident, n in ((3, True, 8), (fresh, False, 8), (fresh, True, 0)):
        assert warm_adaptive_depth(make(depth), lm, ids, n, every_expert_resident=resident) is None
    assert not fresh.verify_costs


def test_prompt_choice_routes_the_greedy_continuation_too():
    # choose_prompt_engine's continuation: the target-only load decodes it greedily and the
    # routing covers the prompt, then every generated token but the last.
    from specter_models.engine.hot_sets import choose_prompt_engine

    config = specter_models.preset_config("tiny-deepseek-v2")
    plan = specter_models.plan_memory(
        config, slots_per_layer=4, dtype=torch.float32, max_seq_len=64
    )
    budget = (plan.expected_peak_bytes + plan.expert_bytes) / 1e9

    def load():
        return load_model(
            "tiny-deepseek-v2", gpu_memory_gb=budget, draft=None, policy="lru", device="cpu",
            dtype=torch.float32, seed=0, max_seq_len=64,
        )  # fmt: skip

    prompt = [5, 17, 3, 29, 42, 7]
    routes = []
    choose = specter_models.choose_hot_experts

    def recording(config, gpu_memory_gb, given, **kwargs):
        routes.append(given[0])
        return choose(config, gpu_memory_gb, given, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(specter_models, "choose_hot_experts", recording)
        alone = choose_prompt_engine(load, budget, prompt, dtype=torch.float32, max_seq_len=64)
        longer = choose_prompt_engine(
            load, budget, prompt, dtype=torch.float32, max_seq_len=64, continuation_tokens=5
        )
    assert (alone.routing_tokens, longer.routing_tokens) == (len(prompt), len(prompt) + 4)
    assert [r.shape[0] for r in routes] == [len(prompt), len(prompt) + 4]
    # The continuation is the greedy one: routing it forced gives the same experts as
    # recording a fresh greedy decode of the same sequence would.
    loaded = load()
    tokens = SpecController(None, loaded.target, depth=0).generate(prompt, 5).tokens
    from specter_models.routing_recorder import RoutingRecorder, teacher_forced_pass

    recorder = RoutingRecorder(loaded.model)
    expected = teacher_forced_pass(
        recorder, loaded.target, prompt + tokens[:-1], 0, loaded.reset
    ).routing
    recorder.remove()
    assert torch.equal(routes[1], expected)
    assert longer.as_dict()["routing_tokens"] == len(prompt) + 4
    with pytest.raises(ValueError, match="continuation_tokens must be >= 0"):
        choose_prompt_engine(load, budget, prompt, dtype=torch.float32, max_seq_len=64,
                             continuation_tokens=-1)  # fmt: skip
