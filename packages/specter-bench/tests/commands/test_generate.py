"""specter generate: a thin layer over the engine; its flags reach the engine and its output."""

import json

import pytest
import torch

import specter_models
from specter_bench.cli import main


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _stats(out):
    """The statistics of ``--json``'s one JSON object."""
    return json.loads(out)["statistics"]


def _text(out):
    return json.loads(out)["text"]


def test_generate_on_a_preset_streams_and_prints_statistics(capsys):
    code, out, err = _run(
        capsys, "--model", "tiny-qwen2-moe", "--max-new-tokens", "6", "--depth", "2", "hi"
    )
    assert code == 0, err
    assert out.startswith("hi")
    table = out.split("-" * 40)[1]
    # The rows that apply, in plain words; one-time costs apart from steady decoding.
    for line in ("steady decoding", "draft tokens accepted", "mean draft depth K",
                 "one-time costs (not in steady decoding):", "  prompt processing (prefill)",
                 "  first decode step (first use of the kernels)"):  # fmt: skip
        assert line in table
    assert table.index("steady decoding") < table.index("one-time costs")
    # Every expert resident on a CPU: no cache, transfer, streaming or GPU-memory rows.
    for absent in ("hit rate", "host-to-GPU", "stream", "peak GPU memory", "graph", " -\n"):
        assert absent not in table, absent
    code, out, _ = _run(
        capsys, "--model", "tiny-qwen2-moe", "--max-new-tokens", "6", "--depth", "2",
        "--verbose", "hi",
    )  # fmt: skip
    for line in ("TPOT (ms, decode only)", "first iteration (ms, in TPOT)",
                 "acceptance (per proposed token)", "mean depth K", "expert cache hit rate",
                 "peak GPU memory (GB)",
                 "steady TPOT (ms, after the first iteration)"):  # fmt: skip
        assert line in out
    assert "random weights and no tokenizer" in err
    code, out, _ = _run(
        capsys, "generate", "--model", "tiny-qwen2-moe", "--max-new-tokens", "5", "--json",
        "--no-stream", "--gpu-memory-gb", "unlimited", "hi",
    )  # fmt: skip
    stats = _stats(out)
    assert stats["new_tokens"] == 5
    # The decode's first iteration, inside the decode time TPOT divides.
    assert 0 < stats["first_iteration_ms"] <= stats["tpot_ms"] * stats["new_tokens"] * 1.0001
    assert stats["slots_per_layer"] == stats["num_experts"]
    assert stats["device"] == "cpu"
    assert stats["graphs_captured"] is None  # a CPU model has no CUDA graphs


def test_generate_warms_the_adaptive_depth_up_only_with_every_expert_resident(capsys):
    runs = {}
    for name, extra in (
        ("auto", ["--gpu-memory-gb", "unlimited"]),
        ("fixed", ["--gpu-memory-gb", "unlimited", "--depth", "2"]),
        ("budget", ["--slots-per-layer", "4"]),
        ("plain", ["--gpu-memory-gb", "unlimited", "--depth", "0"]),
        ("off", ["--gpu-memory-gb", "unlimited", "--depth-warmup", "0"]),
    ):
        code, out, err = _run(
            capsys, "generate", "--model", "tiny-deepseek-v2", "--max-new-tokens", "16",
            "--json", "--no-stream", *extra, "def f(x):",
        )  # fmt: skip
        assert code == 0, err
        runs[name] = (_stats(out), out, err)
    stats, out, err = runs["auto"]
    assert stats["depth_warmup_s"] > 0
    # 16 new tokens: a quarter of them warm up, after the prompt (its real token count).
    assert "decoding 4 greedy tokens after the 10-token prompt once, unrecorded" in err
    assert "--depth-warmup 0 skips it" in err
    assert stats["new_tokens"] == 16
    for name in ("fixed", "budget", "plain", "off"):
        assert runs[name][0]["depth_warmup_s"] is None

    # the warmed decode's greedy text is plain decoding's
    def text(out):
        return _text(out)

    assert text(out) == text(runs["plain"][1])


def test_generate_keeps_the_adaptive_depths_costs_for_the_next_run_of_its_setup(
    capsys, tmp_path, monkeypatch
):
    import os

    from specter_models.engine.depth_memory import CACHE_ENV_VAR

    def generate(*extra):
        code, out, err = _run(
            capsys, "generate", "--model", "tiny-qwen2-moe", "--max-new-tokens", "10", "--json",
            "--no-stream", "--depth-warmup", "0", *extra, "def f(x):",
        )  # fmt: skip
        assert code == 0, err
        return _stats(out), _text(out), err

    folder = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV_VAR, str(folder))
    first, text, err = generate()
    assert first["depth_costs"] == "first run of this setup"
    (stored,) = (folder / "depth-costs").iterdir()
    data = json.loads(stored.read_text())
    assert data["setup"]["model"] == "tiny-qwen2-moe"
    assert data["costs"]["verify"]  # what the policy measured
    second, text2, err = generate()
    assert second["depth_costs"] == "primed from an earlier run"
    assert "starts from the step costs an earlier run of this setup measured" in err
    assert text2 == text  # greedy: the same tokens whatever the depth
    # Another setup has a file of its own; --no-depth-memory neither reads nor writes one.
    other, _, _ = generate("--slots-per-layer", "5")
    assert other["depth_costs"] == "first run of this setup"
    assert len(os.listdir(folder / "depth-costs")) == 2
    off, _, err = generate("--no-depth-memory", "--slots-per-layer", "4")
    assert off["depth_costs"] is None
    assert len(os.listdir(folder / "depth-costs")) == 2
    # A fixed depth has no policy to prime.
    fixed, _, _ = generate("--depth", "2")
    assert fixed["depth_costs"] is None
    # A damaged file is said and replaced, never trusted.
    stored.write_text("{not json")
    again, _, err = generate()
    assert again["depth_costs"] == "first run of this setup"
    assert f"ignoring the depth costs in {stored}" in err
    assert json.loads(stored.read_text())["costs"]["verify"]


def test_generate_streams_missing_experts_on_request(capsys):
    argv = ("generate", "--model", "tiny-deepseek-v2", "--max-new-tokens", "8", "--json",
            "--no-stream", "--slots-per-layer", "2", "--depth", "3", "hi")  # fmt: skip
    runs = {}
    for path in ("load", "stream"):
        code, out, err = _run(capsys, *argv, "--miss-path", path)
        assert code == 0, err
        runs[path] = json.loads(out)
    stats = {path: record["statistics"] for path, record in runs.items()}
    assert runs["stream"]["text"] == runs["load"]["text"]  # the same text
    assert stats["stream"]["miss_path"] == "stream"
    assert stats["stream"]["streamed_mb_per_token"] > 0
    assert stats["load"]["streamed_mb_per_token"] == 0
    code, _, err = _run(capsys, "generate", "--miss-path", "copy", "hi")
    assert code != 0
    assert "invalid choice: 'copy'" in err


def test_generate_streams_under_a_budget_by_default_and_fills_when_decoding_plainly(capsys):
    from specter_bench.model_loading import FILL_CANDIDATES
    from specter_models.engine.engine import engine_choices as generate_engine_choices

    choices = {
        (budgeted, speculate): generate_engine_choices(
            "auto", None, budgeted=budgeted, speculate=speculate
        )
        for budgeted in (False, True)
        for speculate in (False, True)
    }
    assert choices == {
        (False, False): ("load", 0),  # every expert resident: nothing to miss
        (False, True): ("load", 0),
        (True, False): ("stream", FILL_CANDIDATES),  # plain: its cache follows by fills
        (True, True): ("stream", 0),  # speculation: the prefetches keep the free slots
    }
    assert generate_engine_choices("load", None, budgeted=True, speculate=False) == ("load", 0)
    assert generate_engine_choices("stream", 3, budgeted=True, speculate=True) == ("stream", 3)
    argv = ("generate", "--model", "tiny-deepseek-v2", "--max-new-tokens", "8", "--json",
            "--no-stream", "--slots-per-layer", "2", "--depth", "0", "hi")  # fmt: skip
    runs = {}
    for extra in ((), ("--miss-path", "load")):
        code, out, err = _run(capsys, *argv, *extra)
        assert code == 0, err
        runs[extra] = json.loads(out)
    default = runs[()]["statistics"]
    assert runs[()]["text"] == runs[("--miss-path", "load")]["text"]  # the same text
    assert default["miss_path"] == "stream"
    assert default["stream_fills"] == FILL_CANDIDATES
    assert default["streamed_fills"] > 0
    assert default["pipelined_records"] is True  # plain streamed steps pipeline their records
    loaded = runs[("--miss-path", "load")]["statistics"]
    assert loaded["miss_path"] == "load"
    assert loaded["pipelined_records"] is False


def test_generate_demo_defaults_apply_to_the_built_in_model_only():
    import argparse

    from specter_bench.commands.generate import apply_demo_defaults

    def ns(**kw):
        base = {"model": "specter-code-tiny", "depth": None, "gpu_memory_gb": None,
                "slots_per_layer": None}  # fmt: skip
        return argparse.Namespace(**{**base, **kw})

    demo = ns()
    assert apply_demo_defaults(demo, num_experts=16)
    assert (demo.depth, demo.slots_per_layer, demo.gpu_memory_gb) == (4, 8, None)
    # A user's choice, or another model, keeps the general defaults (auto depth).
    cases = [
        (ns(depth=2), (2, None, None)),
        (ns(gpu_memory_gb=8.0), ("auto", None, 8.0)),
        (ns(slots_per_layer=3), ("auto", 3, None)),
        (ns(model="tiny-qwen2-moe"), ("auto", None, None)),
    ]
    for args, expected in cases:
        assert not apply_demo_defaults(args, num_experts=16)
        assert (args.depth, args.slots_per_layer, args.gpu_memory_gb) == expected


def test_generate_samples_reproducibly(capsys):
    # A fixed depth: an adaptive one picks K from measured (wall-clock) times, and K decides
    # which random draws each token uses.
    argv = ["--model", "tiny-phimoe", "--max-new-tokens", "8", "--temperature", "0.9",
            "--top-k", "20", "--seed", "3", "--depth", "3", "--json", "x"]  # fmt: skip
    first = _run(capsys, *argv)
    second = _run(capsys, *argv)
    assert first[0] == second[0] == 0
    assert _text(first[1]) == _text(second[1])


def test_generate_from_a_checkpoint_and_a_prompt_file(capsys, checkpoint, tmp_path):
    prompt = tmp_path / "p.txt"
    prompt.write_text("def add(a, b):")
    code, out, err = _run(
        capsys, "--model", str(checkpoint), "--prompt-file", str(prompt), "--max-new-tokens", "6",
        "--depth", "0",
    )  # fmt: skip
    assert code == 0, err
    assert out.startswith("def add(a, b):")
    assert "draft tokens accepted" not in out  # plain decoding: no speculation rows
    assert "tokens generated" in out


def test_generate_pins_a_hot_set_from_a_file(capsys, tmp_path):
    config = specter_models.preset_config("tiny-deepseek-v2")
    layers = config.num_hidden_layers - config.first_k_dense_replace  # MoE layers
    path = tmp_path / "hot.json"
    path.write_text(json.dumps({"hot_experts": [[0, 1]] * layers}))
    code, out, err = _run(
        capsys, "generate", "--model", "tiny-deepseek-v2", "--max-new-tokens", "4", "--depth",
        "2", "--slots-per-layer", "4", "--hot-experts", str(path), "--json", "--no-stream", "hi",
    )  # fmt: skip
    assert code == 0, err
    assert "hot_experts=2" in err  # the loaded model's repr
    assert _stats(out)["new_tokens"] == 4
    path.write_text(json.dumps({"hot_experts": [[0, 1]] * (layers + 1)}))
    code, _, err = _run(
        capsys, "generate", "--model", "tiny-deepseek-v2", "--max-new-tokens", "2",
        "--slots-per-layer", "4", "--hot-experts", str(path), "hi",
    )  # fmt: skip
    assert code == 2
    assert "one list per MoE layer" in err


def test_generate_takes_a_hot_set_files_pruned_experts(capsys, tmp_path):
    config = specter_models.preset_config("tiny-deepseek-v2")
    layers = config.num_hidden_layers - config.first_k_dense_replace
    path = tmp_path / "hot.jsonl"  # a bench results file's hot set record
    record = {
        "kind": "hot_experts",
        "budget_gb": None,
        "data": {"hot_experts": [[0, 1]] * layers, "pruned_experts": [[5, 7]] * layers},
    }
    path.write_text(json.dumps(record) + "\n")
    argv = (
        "generate",
        "--model",
        "tiny-deepseek-v2",
        "--max-new-tokens",
        "3",
        "--depth",
        "2",
        "--slots-per-layer",
        "4",
        "--hot-experts",
        str(path),
        "--json",
        "--no-stream",
        "hi",
    )
    runs = {}
    for asked in ("auto", "0", "2"):
        code, out, err = _run(capsys, *argv, "--draft-pruned", asked)
        assert code == 0, err
        runs[asked] = _stats(out)
    assert runs["auto"]["draft_pruned_per_layer"] == runs["2"]["draft_pruned_per_layer"] == 2
    assert runs["0"]["draft_pruned_per_layer"] == 0
    assert runs["auto"]["hot_experts_per_layer"] == runs["0"]["hot_experts_per_layer"] == 2
    code, _, err = _run(capsys, *argv, "--draft-pruned", "3")
    assert code == 2
    assert "that file names 2 pruned experts per layer" in err
    path.write_text(json.dumps({"hot_experts": [[0, 1]] * layers}))  # none named: none pruned
    code, out, err = _run(capsys, *argv)
    assert code == 0, err
    assert _stats(out)["draft_pruned_per_layer"] == 0


def test_generate_chooses_a_hot_set_on_the_prompt(capsys, monkeypatch):
    config = specter_models.preset_config("tiny-deepseek-v2")
    plan = specter_models.plan_memory(
        config, slots_per_layer=4, dtype=torch.float32, max_seq_len=64
    )  # generate's KV for this prompt
    budget = (plan.expected_peak_bytes + plan.expert_bytes) / 1e9
    seen = {}
    choose = specter_models.choose_hot_experts

    def recording(config, gpu_memory_gb, routes, **kwargs):
        seen["routes"], seen["budget"] = routes, gpu_memory_gb
        seen["choice"] = choose(config, gpu_memory_gb, routes, **kwargs)
        return seen["choice"]

    monkeypatch.setattr(specter_models, "choose_hot_experts", recording)
    prompt = "def f(x):\n    return x"
    code, out, err = _run(
        capsys, "generate", "--model", "tiny-deepseek-v2", "--max-new-tokens", "3", "--depth",
        "2", "--gpu-memory-gb", str(budget), "--hot-experts", "auto", "--json", "--no-stream",
        prompt,
    )  # fmt: skip
    assert code == 0, err
    (routing,) = seen["routes"]
    layers = config.num_hidden_layers - config.first_k_dense_replace
    # The prompt's own routing: each of its tokens, every MoE layer, top-k.
    from specter_models.engine.model_source import load_tokenizer

    ids = load_tokenizer("tiny-deepseek-v2", int(config.vocab_size)).encode(prompt)
    # ... and its greedy continuation's (3 tokens asked, fewer than CONTINUATION_TOKENS): every
    # position a decode of 3 tokens computes, so the last token's is not among them.
    assert tuple(routing.shape) == (len(ids) + 2, layers, config.num_experts_per_tok)
    assert "the routing of the prompt and its first 3 greedy tokens" in err
    assert seen["budget"] == budget
    stats = _stats(out)
    assert stats["hot_set_choice_s"] > 0
    from specter_bench.cli import build_parser
    from specter_models.engine.hot_sets import CONTINUATION_TOKENS

    assert build_parser().parse_args(["generate"]).hot_set_tokens == CONTINUATION_TOKENS
    # --hot-set-tokens 0: the prompt's routing alone, as before the continuation.
    seen.clear()
    code, out, err = _run(
        capsys, "generate", "--model", "tiny-deepseek-v2", "--max-new-tokens", "3", "--depth",
        "2", "--gpu-memory-gb", str(budget), "--hot-experts", "auto", "--hot-set-tokens", "0",
        "--json", "--no-stream", prompt,
    )  # fmt: skip
    assert code == 0, err
    assert "choosing the hot set on the prompt's routing" in err
    assert seen["routes"][0].shape[0] == len(ids)
    stats = _stats(out)
    assert stats["hot_experts_per_layer"] == seen["choice"].per_layer
    assert stats["slots_per_layer"] == seen["choice"].slots_per_layer
    assert stats["draft_pruned_per_layer"] == seen["choice"].pruned_per_layer == 8 // 3
    assert (
        f"hot set: {seen['choice'].per_layer} experts per layer pinned, 2 pruned from the draft"
        in err
    )
    assert seen["choice"].per_layer > 0  # this prompt and budget: pinning pays
    assert f"hot_experts={seen['choice'].per_layer}, pruned=2)" in err  # the model loaded so


def test_generate_pins_a_prompt_hot_set_by_default_when_speculating_under_a_budget(capsys):
    from specter_models.engine.hot_sets import resolve_hot_experts as generate_hot_experts

    def resolve(choice, speculate=True, budget=24.0, tokens=20, holds_all=False):
        return generate_hot_experts(
            choice,
            speculate=speculate,
            budget_gb=budget,
            prompt_tokens=tokens,
            holds_every_expert=holds_all,
        )

    assert resolve(None) == "auto"
    assert resolve(None, speculate=False) is None  # plain decoding has no draft copies
    assert resolve(None, budget=None) is None  # no budget: every expert resident
    assert resolve(None, tokens=1) is None  # auto scores each half of the routing
    assert resolve(None, holds_all=True) is None  # a slot for every expert: nothing to pin
    assert resolve("auto", holds_all=True) == "auto"
    assert resolve("none") is None
    assert resolve("auto", tokens=1) == "auto"  # asked for: its own error says why not
    assert resolve("hot.json") == "hot.json"
    config = specter_models.preset_config("tiny-deepseek-v2")
    plan = specter_models.plan_memory(
        config, slots_per_layer=4, dtype=torch.float32, max_seq_len=64
    )  # the budget of test_generate_chooses_a_hot_set_on_the_prompt, where pinning pays
    budget = str((plan.expected_peak_bytes + plan.expert_bytes) / 1e9)
    prompt = "def f(x):\n    return x"
    argv = ("generate", "--model", "tiny-deepseek-v2", "--max-new-tokens", "3", "--depth",
            "2", "--gpu-memory-gb", budget, "--json", "--no-stream", prompt)  # fmt: skip
    runs = {}
    for extra in ((), ("--hot-experts", "none")):
        code, out, err = _run(capsys, *argv, *extra)
        assert code == 0, err
        runs[extra] = (_stats(out), err)
    (default, default_err), (none, none_err) = runs[()], runs[("--hot-experts", "none")]
    assert "the default under a budget, --hot-experts none skips it" in default_err
    assert default["hot_experts_per_layer"] > 0
    assert default["draft_pruned_per_layer"] == 8 // 3  # auto: a third, under this budget
    assert default["slots_per_layer"] > none["slots_per_layer"]  # no INT4 copy of pinned ones
    assert none["draft_pruned_per_layer"] == 0  # no hot-set choice: nothing pruned
    assert "choosing the hot set" not in none_err
    assert none["hot_experts_per_layer"] == 0
    code, out, err = _run(capsys, *argv[:6], "0", *argv[7:])  # --depth 0: no draft, no hot set
    assert code == 0, err
    assert "choosing the hot set" not in err
    code, _, err = _run(capsys, *argv[:6], "0", *argv[7:], "--hot-experts", "none")
    assert code == 0, err
    roomy = str(10 * float(budget))  # every expert has a slot beside the draft
    code, out, err = _run(capsys, *argv[:8], roomy, *argv[9:])
    assert code == 0, err
    assert "choosing the hot set" not in err  # no extra load for nothing to pin
    roomy_stats = _stats(out)
    assert roomy_stats["slots_per_layer"] == roomy_stats["num_experts"]


def test_generate_hot_set_auto_needs_a_budget_and_two_tokens(capsys):
    code, _, err = _run(
        capsys, "generate", "--model", "tiny-deepseek-v2", "--max-new-tokens", "2",
        "--hot-experts", "auto", "hi",
    )  # fmt: skip
    assert code == 2
    assert "--hot-experts auto chooses a hot set for a memory budget" in err
    from specter_models.engine.hot_sets import choose_prompt_engine

    def never():
        raise AssertionError("the prompt is checked before anything loads")

    with pytest.raises(ValueError, match="needs at least 2 tokens; this prompt has 1"):
        choose_prompt_engine(never, 1.0, [5], dtype=torch.float32, max_seq_len=64)


def _plain_plan(slots, with_draft):
    # generate's plan for "hi" on the byte-level tiny preset: float32 on the CPU, 64 positions.
    config = specter_models.preset_config("tiny-deepseek-v2")
    return specter_models.plan_memory(
        config, slots_per_layer=slots, dtype=torch.float32, max_seq_len=64, with_draft=with_draft
    )


def test_generate_depth_zero_loads_no_draft_and_gives_its_memory_to_slots(capsys):
    # At a budget that holds the draft and 2 slots a layer, plain decoding holds more slots
    # (the draft's memory), and decodes the same greedy text.
    budget = f"{_plain_plan(2, with_draft=True).expected_peak_bytes / 1e9:.9f}"
    argv = ("generate", "--model", "tiny-deepseek-v2", "--max-new-tokens", "8", "--json",
            "--no-stream", "--gpu-memory-gb", budget, "hi")  # fmt: skip
    runs, notes = {}, {}
    for depth in ("2", "0"):
        code, out, err = _run(capsys, *argv, "--depth", depth)
        assert code == 0, err
        runs[depth] = (_text(out), _stats(out))
        notes[depth] = err
    (spec_text, spec), (plain_text, plain) = runs["2"], runs["0"]
    note = "the INT4 draft leaves 2 FP16 expert slots per layer in this budget; plain decoding"
    assert f"{note} (--depth 0) would have {plain['slots_per_layer']}" in notes["2"]
    assert "the INT4 draft leaves" not in notes["0"]
    assert plain_text == spec_text
    assert spec["slots_per_layer"] == 2
    assert plain["slots_per_layer"] > spec["slots_per_layer"]
    assert plain["mean_depth"] == 0
    assert plain["acceptance_rate"] is None


def test_a_budget_only_plain_decoding_fits_says_so(capsys):
    plain = _plain_plan(1, with_draft=False)
    draft_bytes = _plain_plan(1, with_draft=True).draft_int4_bytes
    assert draft_bytes > 0
    budget = f"{(plain.expected_peak_bytes + draft_bytes / 2) / 1e9:.9f}"
    argv = ("generate", "--model", "tiny-deepseek-v2", "--max-new-tokens", "4", "--json",
            "--no-stream", "--gpu-memory-gb", budget, "hi")  # fmt: skip
    code, _, err = _run(capsys, *argv, "--depth", "2")
    assert code == 2
    assert "too small" in err
    assert "with its INT4 draft: it needs at least" in err
    assert "or --depth 0: plain decoding, without the draft, fits in" in err
    assert "with 1 FP16 expert slots per layer" in err
    code, out, err = _run(capsys, *argv, "--depth", "0")
    assert code == 0, err
    assert _stats(out)["slots_per_layer"] == 1
    code, _, err = _run(capsys, *argv[:-2], "0.000001", "hi", "--depth", "2")
    assert code == 2
    assert "too small" in err
    assert "plain decoding, without the draft, fits" not in err  # it does not fit either
    assert err.count("needs at least") == 1  # one shortfall, said once


def test_generate_auto_decodes_plainly_where_the_prompts_routing_moves_fewer_experts(
    capsys, monkeypatch
):
    # --depth auto under a budget replays the prompt's routing through the hot set's slots
    # and through the draftless ones, and decodes without the draft where that moves fewer
    # experts; the real comparison first, then each branch forced, then --keep-draft.
    config = specter_models.preset_config("tiny-deepseek-v2")
    plan = specter_models.plan_memory(
        config, slots_per_layer=4, dtype=torch.float32, max_seq_len=64
    )
    budget = str((plan.expected_peak_bytes + plan.expert_bytes) / 1e9)
    prompt = "def f(x):\n    return x"
    argv = ("generate", "--model", "tiny-deepseek-v2", "--max-new-tokens", "6", "--json",
            "--no-stream", "--gpu-memory-gb", budget, prompt)  # fmt: skip

    def stats(*extra):
        code, out, err = _run(capsys, *argv, *extra)
        assert code == 0, err
        return _text(out), _stats(out), err

    text, real, err = stats()
    auto = real["auto_choice"]
    plain_wins = auto["in_place_read_cost"] * auto["plain_loads"] < auto["draft_loads"]
    assert auto["in_place_read_cost"] > 1  # a read in place costs more than a prefetch
    assert auto["decoded"] == ("plain" if plain_wins else "speculative")
    assert f"moves {auto['draft_loads']} experts with the draft" in err
    plain_slots = auto["plain_slots_per_layer"]
    assert plain_slots > auto["draft_slots_per_layer"] - auto["draft_hot_experts_per_layer"]
    replay = specter_models.replay_plain_decoding

    def forced(loads):
        def fake(*args, **kwargs):
            return specter_models.PlainReplay(replay(*args, **kwargs).slots_per_layer, loads)

        monkeypatch.setattr(specter_models, "replay_plain_decoding", fake)

    forced(0)  # plain decoding moves nothing: no draft
    plain_text, plain, err = stats()
    assert plain["auto_choice"]["decoded"] == "plain"
    assert "decoding plainly, without the INT4 draft (--keep-draft speculates anyway)" in err
    assert plain["mean_depth"] == 0
    assert plain["hot_experts_per_layer"] == 0
    assert plain["slots_per_layer"] == plain_slots
    assert plain["stream_fills"] > 0  # plain streamed decoding's fills, as --depth 0 gets
    depth0_text, depth0, _ = stats("--depth", "0")
    assert plain_text == text == depth0_text  # greedy: the same text either way
    assert depth0["slots_per_layer"] == plain_slots
    forced(10**9)  # plain decoding would move far more: speculate with the hot set
    spec_text, spec, err = stats()
    assert spec["auto_choice"]["decoded"] == "speculative"
    assert spec["hot_experts_per_layer"] == spec["auto_choice"]["draft_hot_experts_per_layer"]
    assert spec["slots_per_layer"] == spec["auto_choice"]["draft_slots_per_layer"]
    assert spec_text == text
    forced(0)
    _, kept, err = stats("--keep-draft")
    assert kept["auto_choice"] is None  # not compared: the draft stays
    assert kept["hot_experts_per_layer"] == spec["hot_experts_per_layer"]
    assert "auto:" not in err
    _, fixed, _ = stats("--depth", "2")
    assert fixed["auto_choice"] is None  # a fixed depth speculates as asked


def test_generate_json_is_one_object_with_the_text_and_nothing_else(capsys):
    code, out, err = _run(
        capsys, "--model", "tiny-qwen2-moe", "--max-new-tokens", "6", "--depth", "2", "--json",
        "hi",
    )  # fmt: skip
    assert code == 0, err
    record = json.loads(out)  # the whole of stdout: one JSON object
    assert record["prompt"] == "hi"
    assert len(record["token_ids"]) == record["statistics"]["new_tokens"] == 6
    assert record["text"]
    assert record["stop_reason"] == "max_new_tokens"
    assert "loading tiny-qwen2-moe" in err  # progress stays on stderr


def test_generate_skips_the_depth_warm_up_for_short_requests(capsys):
    code, out, err = _run(
        capsys, "generate", "--model", "tiny-deepseek-v2", "--max-new-tokens", "8", "--json",
        "--gpu-memory-gb", "unlimited", "def f(x):",
    )  # fmt: skip
    assert code == 0, err
    assert _stats(out)["depth_warmup_s"] is None
    assert "warming" not in err


def test_generate_reports_a_binary_prompt_file_by_name(capsys, tmp_path):
    binary = tmp_path / "prompt.bin"
    binary.write_bytes(bytes([0xB1, 0x00, 0xFF]))
    code, out, err = _run(capsys, "generate", "--prompt-file", str(binary))
    assert code == 2
    assert f"--prompt-file {binary}: not UTF-8 text (byte 0xb1 at offset 0)" in err
    assert out == ""


def test_a_budget_too_small_gives_advice_generate_can_act_on(capsys):
    code, _, err = _run(capsys, "--model", "tiny-qwen2-moe", "--gpu-memory-gb", "0.001", "x")
    assert code == 2
    message = err.strip().splitlines()[-1]
    assert "--gpu-memory-gb 0.001 is too small for tiny-qwen2-moe" in message
    assert "max_seq_len" not in message  # not an option of generate
    smallest = float(message.split("Give --gpu-memory-gb ")[1].split()[0])
    assert message.count("needs at least") == 1  # said once
    code, _, err = _run(
        capsys, "--model", "tiny-qwen2-moe", "--gpu-memory-gb", f"{smallest}", "--json",
        "--max-new-tokens", "2", "--hot-experts", "none", "x",
    )  # fmt: skip
    assert code == 0, err  # the advised budget works


def test_generate_decodes_plainly_with_cpu_experts_and_refuses_bad_thread_counts(capsys):
    import os

    argv = ("generate", "--model", "tiny-qwen2-moe", "--max-new-tokens", "8", "--json",
            "--no-stream", "--slots-per-layer", "2", "--depth", "0", "hi there")  # fmt: skip
    code, out, err = _run(capsys, *argv)
    assert code == 0, err
    off = json.loads(out)
    code, out, err = _run(capsys, *argv, "--cpu-experts", "on", "--cpu-threads", "1")
    assert code == 0, err
    on = json.loads(out)
    assert on["token_ids"] == off["token_ids"]  # float32 CPU: the host's sums agree here
    assert "CPU experts:" in err
    stats = on["statistics"]
    assert stats["cpu_placement"]["active"]
    assert stats["placement"]["cpu"] > 0
    assert stats["cpu_experts"]["threads"] == 1
    assert off["statistics"]["placement"]["cpu"] == 0
    cores = os.cpu_count() or 1
    for bad in ("0", str(cores + 1), "many"):
        code, _, err = _run(capsys, "generate", "--cpu-threads", bad, "hi")
        assert code == 2
        assert f"from 1 to this machine's {cores} cores" in err
    code, _, err = _run(capsys, "generate", "--cpu-experts", "sometimes", "hi")
    assert code == 2
    assert "invalid choice: 'sometimes'" in err


def test_generate_prints_the_placement_split_with_cpu_experts(capsys):
    code, out, err = _run(
        capsys, "generate", "--model", "tiny-deepseek-v2", "--max-new-tokens", "6",
        "--slots-per-layer", "2", "--depth", "2", "--cpu-experts", "on", "--cpu-threads", "1",
        "--no-stream", "hi",
    )  # fmt: skip
    assert code == 0, err
    assert "experts a token: resident / moved / streamed / CPU" in out
    assert "host CPU time a token" in out


def test_generate_cpu_experts_on_where_the_kernel_cannot_run_says_why(capsys, monkeypatch):
    from specter_models import cpu_experts

    def unsupported(*args, **kwargs):
        raise RuntimeError("not implemented for 'Float'")

    monkeypatch.setattr(cpu_experts.F, "linear", unsupported)
    code, _, err = _run(
        capsys, "generate", "--model", "tiny-qwen2-moe", "--max-new-tokens", "4",
        "--slots-per-layer", "2", "--depth", "0", "--cpu-experts", "on", "hi",
    )  # fmt: skip
    assert code == 2
    assert "cannot run here" in err
    assert "--cpu-experts off" in err
    assert "Traceback" not in err


def test_generate_decodes_several_prompts_together_as_each_alone(capsys):
    common = ["--model", "tiny-qwen2-moe", "--max-new-tokens", "6", "--depth", "2", "--json"]
    alone = []
    for prompt in ("def f(x):", "ab"):
        code, out, err = _run(capsys, "generate", *common, prompt)
        assert code == 0, err
        alone.append(json.loads(out)["token_ids"])
    code, out, err = _run(
        capsys, "generate", *common, "--max-batch", "2", "def f(x):", "--prompt", "ab",
        "--prompt", "def f(x):",
    )  # fmt: skip
    assert code == 0, err
    record = json.loads(out)
    assert record["prompts"] == ["def f(x):", "ab", "def f(x):"]
    assert [r["token_ids"] for r in record["results"]] == [*alone, alone[0]]
    assert [r["stop_reason"] for r in record["results"]] == ["max_new_tokens"] * 3
    stats = record["statistics"]
    assert stats["max_batch"] == 2
    assert stats["tokens_out"] == 18
    assert 1 < stats["mean_active_batch"] <= 2  # the third joined when a slot was free
    assert len(stats["working_set_target_per_layer"]) == 2  # one per MoE layer
    code, out, err = _run(
        capsys, "generate", *common[:-1], "--max-batch", "2", "--prompt", "x", "--prompt", "yz"
    )
    assert code == 0, err
    assert out.startswith("[1/2] x") or out.startswith("[2/2] yz")
    for row in ("sequences", "2 (at most 2 at once)", "experts a verification needs per layer"):
        assert row in out


def test_generate_refuses_an_empty_prompt_and_a_batch_below_one(capsys):
    code, _, err = _run(capsys, "generate", "--prompt", "a", "--prompt", "")
    assert code == 2
    assert "prompt 2 is empty" in err
    code, _, err = _run(capsys, "generate", "--max-batch", "0", "x")
    assert code == 2
    assert "--max-batch" in err


def test_trial_tokens_reach_the_engine_config(capsys):
    from specter_bench.cli import build_parser
    from specter_bench.commands.generate import engine_config_from_args

    parser = build_parser()
    base = ["generate", "--model", "tiny-qwen2-moe", "--gpu-memory-gb", "20", "--depth", "auto"]

    def config(*extra):
        args = parser.parse_args([*base, *extra])
        args.max_positions = None  # run() sets it from the model's configuration
        return engine_config_from_args(args, device="cpu", prompt_tokens=10)

    assert config().speculation.trial_tokens is None  # 32 on CUDA, none elsewhere
    assert config("--trial-tokens", "8").speculation.trial_tokens == 8
    assert config("--trial-tokens", "0").speculation.trial_tokens == 0
    with pytest.raises(SystemExit):
        parser.parse_args([*base, "--trial-tokens", "-1"])
    assert "--trial-tokens" in capsys.readouterr().err
