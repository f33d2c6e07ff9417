"""The specter command line: every command runs on tiny models; bad arguments fail clearly."""

import json
import re
import subprocess
import sys

import pytest
import torch

import specter_models
from specter_bench.cli import main


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny DeepSeek-V2 checkpoint folder with a tokenizer, as save_pretrained writes it."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("ckpt")
    model = specter_models.build_reference_model("tiny-deepseek-v2", seed=4, device="cpu")
    model.float().save_pretrained(folder)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    corpus = ["def add(a, b): return a + b", "for i in range(10): print(i)"] * 20
    trainer = trainers.BpeTrainer(vocab_size=90, special_tokens=["<unk>", "<s>", "</s>"])
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    fast.save_pretrained(folder)
    return folder


def test_generate_on_a_preset_streams_and_prints_statistics(capsys):
    code, out, err = _run(
        capsys, "--model", "tiny-qwen2-moe", "--max-new-tokens", "6", "--depth", "2", "hi"
    )
    assert code == 0, err
    assert out.startswith("hi")
    for line in ("TPOT (ms, decode only)", "first iteration (ms, in TPOT)",
                 "acceptance (per proposed token)", "mean depth K", "expert cache hit rate",
                 "peak GPU memory (GB)"):  # fmt: skip
        assert line in out
    assert "random weights and no tokenizer" in err
    code, out, _ = _run(
        capsys, "generate", "--model", "tiny-qwen2-moe", "--max-new-tokens", "5", "--json",
        "--no-stream", "--gpu-memory-gb", "unlimited", "hi",
    )  # fmt: skip
    stats = json.loads(out.strip().splitlines()[-1])
    assert stats["new_tokens"] == 5
    # The decode's first iteration, inside the decode time TPOT divides.
    assert 0 < stats["first_iteration_ms"] <= stats["tpot_ms"] * stats["new_tokens"] * 1.0001
    assert stats["slots_per_layer"] == stats["num_experts"]
    assert stats["device"] == "cpu"
    assert stats["graphs_captured"] is None  # a CPU model has no CUDA graphs


def test_generate_captures_the_decode_graphs_before_decoding(capsys):
    # On CUDA, generate captures ahead the graphs its steps replay (windows from the prompt
    # on; one row when decoding plainly), then resets the model, so no timed step captures.
    from specter_bench.text_generation import CAPTURE_AHEAD_POSITIONS, capture_decode_graphs

    class Model:
        cuda_graphs = True

        def __init__(self):
            self.calls = []

        def capture_step_graphs(self, max_length=None, **kwargs):
            self.calls.append(("capture", max_length, kwargs))
            return {"target": 2, "draft": 3} if kwargs["max_rows"] is None else {"target": 1}

        def reset(self):
            self.calls.append(("reset",))

    for speculate, rows, count in ((True, None, 5), (False, 1, 1)):
        model = Model()
        result = capture_decode_graphs(model, prompt_length=37, speculate=speculate)
        assert model.calls == [
            ("capture", 37 + CAPTURE_AHEAD_POSITIONS, {"min_length": 37, "max_rows": rows}),
            ("reset",),
        ]
        assert result["graphs_captured"] == count
        assert result["graph_capture_s"] >= 0
    assert f"captured {count} CUDA graphs" in capsys.readouterr().err
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
    from specter_bench.engine_systems import make_depth_policy
    from specter_bench.text_generation import warm_adaptive_depth
    from specter_spec import SpecController

    lm = specter_models.load("tiny-deepseek-v2", device="cpu", seed=3, max_seq_len=128)
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
            capsys, "generate", "--model", "tiny-deepseek-v2", "--max-new-tokens", "12",
            "--json", "--no-stream", *extra, "def f(x):",
        )  # fmt: skip
        assert code == 0, err
        runs[name] = (json.loads(out.strip().splitlines()[-1]), out, err)
    stats, out, err = runs["auto"]
    assert stats["depth_warmup_s"] > 0
    assert "warming --depth auto up on 12 tokens" in err
    assert stats["new_tokens"] == 12
    for name in ("fixed", "budget", "plain", "off"):
        assert runs[name][0]["depth_warmup_s"] is None

    # the warmed decode's greedy text is plain decoding's
    def text(out):
        return out.strip().splitlines()[:-1]  # all but the statistics line

    assert text(out) == text(runs["plain"][1])


def test_generate_keeps_the_adaptive_depths_costs_for_the_next_run_of_its_setup(
    capsys, tmp_path, monkeypatch
):
    import os

    from specter_bench.depth_memory import CACHE_ENV_VAR

    def generate(*extra):
        code, out, err = _run(
            capsys, "generate", "--model", "tiny-qwen2-moe", "--max-new-tokens", "10", "--json",
            "--no-stream", "--depth-warmup", "0", *extra, "def f(x):",
        )  # fmt: skip
        assert code == 0, err
        return json.loads(out.strip().splitlines()[-1]), out.strip().splitlines()[:-1], err

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
        runs[path] = out.strip().splitlines()
    stats = {path: json.loads(lines[-1]) for path, lines in runs.items()}
    assert runs["stream"][:-1] == runs["load"][:-1]  # the same text
    assert stats["stream"]["miss_path"] == "stream"
    assert stats["stream"]["streamed_mb_per_token"] > 0
    assert stats["load"]["streamed_mb_per_token"] == 0
    code, _, err = _run(capsys, "generate", "--miss-path", "copy", "hi")
    assert code != 0
    assert "invalid choice: 'copy'" in err


def test_generate_streams_under_a_budget_by_default_and_fills_when_decoding_plainly(capsys):
    from specter_bench.model_loading import FILL_CANDIDATES
    from specter_bench.text_generation import generate_engine_choices

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
        runs[extra] = out.strip().splitlines()
    default = json.loads(runs[()][-1])
    assert runs[()][:-1] == runs[("--miss-path", "load")][:-1]  # the same text
    assert default["miss_path"] == "stream"
    assert default["stream_fills"] == FILL_CANDIDATES
    assert default["streamed_fills"] > 0
    assert default["pipelined_records"] is True  # plain streamed steps pipeline their records
    loaded = json.loads(runs[("--miss-path", "load")][-1])
    assert loaded["miss_path"] == "load"
    assert loaded["pipelined_records"] is False


def test_generate_demo_defaults_apply_to_the_built_in_model_only():
    import argparse

    from specter_bench.text_generation import apply_demo_defaults

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
    assert first[1].splitlines()[0] == second[1].splitlines()[0]


def test_default_command_runs_the_demo_model_through_specter(capsys, checkpoint, monkeypatch):
    # Stand in for the shipped specter-code-tiny: `specter` with no argument loads the demo.
    import specter_models.loader
    import specter_models.presets

    monkeypatch.setattr(specter_models.presets, "demo_model_path", lambda: checkpoint)
    monkeypatch.setattr(specter_models.loader, "demo_model_path", lambda: checkpoint)
    code, out, err = _run(capsys, "--max-new-tokens", "12", "--slots-per-layer", "3")
    assert code == 0, err
    assert "loaded SpecterModel(deepseek_v2" in err
    assert "draft=int4" in err
    assert out.startswith("def fibonacci(n):")
    assert "expert slots per layer           3/8" in out
    assert "random weights" not in err  # a checkpoint with its own tokenizer


def test_generate_from_a_checkpoint_and_a_prompt_file(capsys, checkpoint, tmp_path):
    prompt = tmp_path / "p.txt"
    prompt.write_text("def add(a, b):")
    code, out, err = _run(
        capsys, "--model", str(checkpoint), "--prompt-file", str(prompt), "--max-new-tokens", "6",
        "--depth", "0",
    )  # fmt: skip
    assert code == 0, err
    assert out.startswith("def add(a, b):")
    assert "mean depth K                     0.00" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["generate", "--depth", "deep"], "depth must be an int >= 0"),
        (["generate", "--gpu-memory-gb", "-3"], "GPU memory budget must be a number of GB > 0"),
        (["generate", "--model", "tiny-qwen2-moe", "--top-p", "0.5", "x"], "need sampling"),
        (["generate", "--model", "tiny-qwen2-moe", "--device", "tpu", "x"], "--device must be"),
        (["generate", "--model", "gpt-5", "x"], "known presets"),
        (["generate", "--model", "/no/such/ckpt", "x"], "no checkpoint folder at '/no/such/ckpt'"),
        (["generate", "--model", "tiny-qwen2-moe", "--gpu-memory-gb", "0.001", "x"], "too small"),
        (["generate", "--prompt-file", "/no/such/file"], "no such file"),
        (
            ["generate", "--model", "tiny-qwen2-moe", "--depth", "0", "--hot-experts", "auto"],
            "--depth 0 decodes without a draft",
        ),
        (
            ["generate", "--model", "tiny-qwen2-moe", "--depth", "0", "--keep-draft", "x"],
            "--depth 0 decodes plainly without one: leave --keep-draft out",
        ),
        (["bench"], "--model is required"),
        (["bench", "--model", "tiny-qwen2-moe", "--experiment", "fast"], "unknown experiment"),
        (["bench", "--model", "tiny-qwen2-moe", "--systems", "vllm"], "unknown system 'vllm'"),
        (["bench", "--model", "tiny-qwen2-moe", "--budgets", "x"], "GPU memory budget must be"),
        (["kernel-bench", "--tokens", "a,b"], "comma-separated list of ints"),
        (["bench", "--model", "tiny-qwen2-moe", "--hot-experts", "-1"], "expected an int >= 0"),
        (["bench", "--model", "tiny-qwen2-moe", "--calibration-prompts", "x"], "an int >= 0"),
        (["bench", "--model", "tiny-qwen2-moe", "--sweep-prompts", "0"], "an int >= 1"),
        (["generate", "--batch-invariant", "maybe", "x"], "expected auto, on or off"),
        (["generate", "--depth-warmup", "-1", "x"], "expected an int >= 0, got '-1'"),
        (["report", "/no/such.jsonl"], "does not exist"),
    ],
)
def test_bad_arguments_fail_with_a_clear_message(capsys, argv, message):
    code, _, err = _run(capsys, *argv)
    assert code == 2
    assert message in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a CPU-only machine")
def test_cuda_asked_for_without_a_gpu(capsys):
    code, _, err = _run(capsys, "generate", "--device", "cuda", "--model", "tiny-phimoe", "x")
    assert code == 2
    assert "torch sees no CUDA GPU" in err


def test_info_prints_the_machine_and_the_memory_plan(capsys):
    code, out, _ = _run(capsys, "info", "--model", "deepseek-v2-lite", "--gpu-memory-gb", "24")
    assert code == 0
    assert "GPU: none visible" in out or "GPU: " in out
    assert "versions: torch" in out
    assert "memory plan: deepseek-v2-lite (deepseek_v2) at 24 GB" in out
    assert "INT4 draft experts" in out
    assert "per layer x 26 layers" in out
    plain = "without the INT4 draft (generate --depth 0): 46/64 FP16 expert slots per layer"
    assert plain in out  # the draft's memory, as slots
    # 4 GB holds the model without its draft only: info says why and shows that plan.
    code, out, _ = _run(capsys, "info", "--model", "deepseek-v2-lite", "--gpu-memory-gb", "4")
    assert code == 0
    assert "with the INT4 draft: does not fit: gpu_memory_gb=4.0 is too small" in out
    assert "without the INT4 draft (generate --depth 0, plain decoding):" in out
    assert "none (no draft: plain decoding)" in out.split("plain decoding):")[1]
    assert "FP16 expert slots (1/64 per layer x 26 layers)" in out
    # 2 GB holds it neither way: both shortfalls, the speculative one first.
    code, _, err = _run(capsys, "info", "--model", "deepseek-v2-lite", "--gpu-memory-gb", "2")
    assert code == 2
    speculative, plain = err.split("Without the INT4 draft (--depth 0, plain decoding)")
    assert "INT4 draft experts" in speculative
    needs = [float(m) for m in re.findall(r"needs at least ([0-9.]+) GB", err)]
    assert len(needs) == 2
    assert needs[1] < needs[0]  # plain decoding needs less: no INT4 draft
    assert "does not fit either" in plain


def test_bench_kernel_bench_profile_depth_and_report(capsys, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "def f(x):"}) + "\n")
    out_dir = tmp_path / "results"
    code, out, err = _run(
        capsys, "bench", "--model", "tiny-qwen2-moe", "--experiment", "tpot", "--systems",
        "lru,specter", "--budgets", "unlimited", "--prompts", "jsonl", "--prompts-path",
        str(prompts), "--max-new-tokens", "4", "--depth", "2", "--dtype", "float64", "--out",
        str(out_dir), "--tag", "cli",
    )  # fmt: skip
    assert code == 0, err
    results = out_dir / "bench-tiny-qwen2-moe-cli.jsonl"
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    assert {(r["kind"], r.get("system")) for r in lines} == {
        ("tpot", "lru"), ("tpot", "specter"), ("memory", None),
    }  # fmt: skip
    assert "| tiny-qwen2-moe | unlimited | specter |" in out
    assert lines[0]["identity"]["command"].startswith("specter bench --model tiny-qwen2-moe")

    code, out, _ = _run(
        capsys, "kernel-bench", "--model", "tiny-phimoe", "--tokens", "1,3", "--repeats", "2",
        "--out", str(out_dir),
    )  # fmt: skip
    assert code == 0
    assert out.count("fused_w4a16") == 2
    kernel = json.loads((out_dir / "kernel-tiny-phimoe.jsonl").read_text())
    assert [t["tokens"] for t in kernel["data"]["timings"]] == [1, 1, 1, 3, 3, 3]
    assert all(t["relative_error"] < 1e-2 for t in kernel["data"]["timings"])

    code, out, _ = _run(
        capsys, "profile-depth", "--model", "tiny-deepseek-v2", "--depths", "0,2",
        "--prompts", "jsonl", "--prompts-path", str(prompts), "--max-new-tokens", "4",
    )  # fmt: skip
    assert code == 0
    assert "best depth:" in out

    page = tmp_path / "bench.md"
    code, out, _ = _run(
        capsys, "report", str(results), str(out_dir / "kernel-tiny-phimoe.jsonl"), "--markdown",
        str(page), "--list-command", "specter bench ...",
    )  # fmt: skip
    assert code == 0
    text = page.read_text()
    assert "### TPOT per system" in text
    assert "### Routed-expert kernels (one MoE layer)" in text
    assert "specter bench ..." in text


def _tiny_tpot_bench(capsys, tmp_path, model: str, tag: str, *extra: str) -> list[dict]:
    """One specter-bench TPOT run of a tiny model on one prompt; its records."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "def f(x):"}) + "\n")
    code, _, err = _run(
        capsys, "bench", "--model", model, "--experiment", "tpot", "--systems", "specter",
        "--budgets", "unlimited", "--prompts", "jsonl", "--prompts-path", str(prompts),
        "--max-new-tokens", "3", "--depth", "2", "--dtype", "float32", "--warmup", "0",
        "--out", str(tmp_path), "--tag", tag, *extra,
    )  # fmt: skip
    assert code == 0, err
    lines = (tmp_path / f"bench-{model}-{tag}.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@pytest.mark.parametrize(("flag", "expected"), [(None, False), ("on", True), ("off", False)])
def test_bench_records_whether_verification_was_batch_invariant(capsys, tmp_path, flag, expected):
    # auto is off on the CPU (on for fp16/bf16 on CUDA); "on" forces it anywhere.
    extra = ["--batch-invariant", flag] if flag is not None else []
    records = _tiny_tpot_bench(capsys, tmp_path, "tiny-deepseek-v2", "bi", *extra)
    tpot = [r for r in records if r["kind"] == "tpot"]
    assert [r["extra"]["settings"]["batch_invariant"] for r in tpot] == [expected]


@pytest.mark.parametrize(
    ("extra", "refusal"),
    [
        ((), None),
        (("--cuda-graphs", "off"), None),
        (("--cuda-graphs", "on"), "cuda_graphs=True needs a CUDA device"),
        (("--piecewise-graphs", "on"), "piecewise_graphs=True needs CUDA graphs"),
    ],
)
def test_bench_records_cuda_graphs_and_refuses_them_on_the_cpu(capsys, tmp_path, extra, refusal):
    records = _tiny_tpot_bench(capsys, tmp_path, "tiny-qwen2-moe", "cg", "--device", "cpu", *extra)
    if refusal is not None:  # CUDA graphs on a CPU model: the stage is skipped with the reason
        assert [r["kind"] for r in records] == ["skipped"]
        assert refusal in records[0]["data"]["reason"]
        return
    tpot = [r for r in records if r["kind"] == "tpot"]
    settings = tpot[0]["extra"]["settings"]
    assert settings["cuda_graphs"] is False
    assert settings["graphs"] == {"target": None, "draft": None}


@pytest.mark.parametrize(("flag", "expected"), [(None, True), ("on", True), ("off", False)])
def test_bench_records_the_shared_overlap_switch(capsys, tmp_path, flag, expected):
    # DeepSeek-V2's two MoE blocks have shared experts; the CPU runs them in order either way.
    extra = ["--shared-overlap", flag] if flag is not None else []
    records = _tiny_tpot_bench(capsys, tmp_path, "tiny-deepseek-v2", "so", *extra)
    tpot = [r for r in records if r["kind"] == "tpot"]
    overlap = tpot[0]["extra"]["settings"]["shared_overlap"]
    assert overlap == {"enabled": expected, "blocks": 2, "forks": 0}


def test_bench_sweep_prompts_reach_the_config():
    from specter_bench.bench_command import bench_config_from_args
    from specter_bench.cli import build_parser

    parser = build_parser()
    default = bench_config_from_args(
        parser.parse_args(["bench", "--model", "tiny-qwen2-moe"]), "cpu"
    )
    argv = ["bench", "--model", "tiny-qwen2-moe", "--sweep-prompts", "3", "--depths", "1,3"]
    config = bench_config_from_args(parser.parse_args(argv), "cpu")
    assert (config.sweep_prompts, config.sweep_depths) == (3, (1, 3))
    assert default.sweep_prompts == 2


@pytest.mark.parametrize(("argv", "expected"), [([], None), (["--calibration-prompts", "0"], 0)])
def test_bench_calibration_prompts_reach_the_config(argv, expected):
    # Unset, the CLI leaves the count to the library's default (BenchConfig's, 8 decodes).
    from specter_bench.bench_command import bench_config_from_args
    from specter_bench.cli import build_parser
    from specter_bench.experiments import DEFAULT_CALIBRATION_PROMPTS, BenchConfig

    args = build_parser().parse_args(["bench", "--model", "tiny-qwen2-moe", *argv])
    config = bench_config_from_args(args, "cpu")
    want = DEFAULT_CALIBRATION_PROMPTS if expected is None else expected
    assert config.calibration_prompts == want
    assert BenchConfig.calibration_prompts == DEFAULT_CALIBRATION_PROMPTS == 8


def test_python_dash_m_runs_the_cli():
    done = subprocess.run(
        [sys.executable, "-m", "specter_bench", "--help"], capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0
    for command in ("generate", "bench", "profile-depth", "kernel-bench", "info", "report"):
        assert command in done.stdout


@pytest.mark.parametrize("count", ["auto", "1"])
def test_bench_pins_the_chosen_or_the_given_hot_count(capsys, tmp_path, count):
    # Three prompts: one measured, two calibrating; a budget of 4 slots per layer.
    prompts = tmp_path / "p.jsonl"
    texts = ("def f(x):", "import sys\n", "class A:\n    pass\n")
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    config = specter_models.preset_config("tiny-deepseek-v2")
    plan = specter_models.plan_memory(
        config,
        slots_per_layer=4,
        dtype=torch.float32,
        max_seq_len=64,  # the bench's KV here
    )
    budget = (plan.expected_peak_bytes + plan.expert_bytes) / 1e9
    code, _, err = _run(
        capsys, "bench", "--model", "tiny-deepseek-v2", "--experiment", "tpot", "--systems",
        "specter", "--budgets", str(budget), "--prompts", "jsonl", "--prompts-path",
        str(prompts), "--num-prompts", "1", "--max-new-tokens", "3", "--depth", "2",
        "--dtype", "float32", "--warmup", "0", "--out", str(tmp_path), "--tag", "hot",
        "--hot-experts", count,
    )  # fmt: skip
    assert code == 0, err
    lines = (tmp_path / "bench-tiny-deepseek-v2-hot.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    (hot,) = [r["data"] for r in records if r["kind"] == "hot_experts"]
    (tpot,) = [r for r in records if r["kind"] == "tpot"]
    assert hot["forced"] is (count != "auto")
    assert set(hot["loads"]) == ({"1"} if count == "1" else {str(h) for h in hot["loads"]})
    if count == "1":
        assert hot["per_layer"] == 1
    assert tpot["extra"]["settings"]["hot_experts_per_layer"] == hot["per_layer"]
    assert len(hot["calibration_prompts"]) == 2
    assert tpot["prompt_id"] not in hot["calibration_prompts"]


def test_bench_prunes_the_calibrations_coldest_experts_from_the_draft(capsys, tmp_path):
    prompts = tmp_path / "p.jsonl"
    texts = ("def f(x):", "import sys\n", "class A:\n    pass\n")
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    config = specter_models.preset_config("tiny-deepseek-v2")
    plan = specter_models.plan_memory(
        config, slots_per_layer=4, dtype=torch.float32, max_seq_len=64
    )
    budget = (plan.expected_peak_bytes + plan.expert_bytes) / 1e9
    code, _, err = _run(
        capsys, "bench", "--model", "tiny-deepseek-v2", "--experiment", "tpot", "--systems",
        "specter,specter-no-hot", "--budgets", str(budget), "--prompts", "jsonl",
        "--prompts-path", str(prompts), "--num-prompts", "1", "--max-new-tokens", "3",
        "--depth", "2", "--dtype", "float32", "--warmup", "0", "--out", str(tmp_path), "--tag",
        "pruned", "--hot-experts", "1", "--draft-pruned", "5",
    )  # fmt: skip
    assert code == 0, err
    lines = (tmp_path / "bench-tiny-deepseek-v2-pruned.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    (hot,) = [r["data"] for r in records if r["kind"] == "hot_experts"]
    assert hot["pruned_per_layer"] == 5
    assert all(len(p) == 5 for p in hot["pruned_experts"])
    for pinned, pruned in zip(hot["hot_experts"], hot["pruned_experts"], strict=True):
        assert not set(pinned) & set(pruned)
    tpots = {r["system"]: r for r in records if r["kind"] == "tpot"}
    assert tpots["specter"]["extra"]["settings"]["draft_pruned_per_layer"] == 5
    assert tpots["specter-no-hot"]["extra"]["settings"]["draft_pruned_per_layer"] == 0
    # the pruned experts' INT4 memory bought slots, as the plan with them says
    pruned_plan = specter_models.plan_memory(
        config, budget, dtype=torch.float32, max_seq_len=64, hot_experts_per_layer=1,
        pruned_experts_per_layer=5,
    )  # fmt: skip
    assert tpots["specter"]["slots_per_layer"][0] == pruned_plan.slots_per_layer
    assert pruned_plan.slots_per_layer > tpots["specter-no-hot"]["slots_per_layer"][0]
    code, _, err = _run(capsys, "bench", "--model", "tiny-deepseek-v2", "--draft-pruned", "-1")
    assert code == 2
    assert "--draft-pruned: expected an int >= 0, got '-1'" in err


def test_info_shows_the_plan_with_a_pinned_hot_set(capsys):
    argv = ("info", "--model", "deepseek-v2-lite", "--gpu-memory-gb", "24", "--draft-pruned", "0")
    code, plain, _ = _run(capsys, *argv)
    assert code == 0
    code, pinned, _ = _run(capsys, *argv, "--hot-experts", "36")
    assert code == 0
    assert "INT4 draft experts (64/64 per layer)" in plain
    assert "INT4 draft experts (28/64 per layer)" in pinned
    # Without a hot set the plan says that bench and generate pin one, and how to see it.
    assert "--hot-experts N shows the plan with N pinned" in plain
    assert "--hot-experts N shows" not in pinned
    code, unlimited, _ = _run(capsys, "info", "--model", "deepseek-v2-lite")
    assert code == 0
    assert "--hot-experts N shows" not in unlimited  # no budget: no slots to free

    def slots(out):
        line = next(line for line in out.splitlines() if line.startswith("FP16 expert slots"))
        return int(line.split("(")[1].split("/")[0])

    assert slots(pinned) > slots(plain)
    code, _, err = _run(capsys, *argv, "--hot-experts", "65")
    assert code == 2
    assert "65" in err
    code, pruned, _ = _run(capsys, *argv[:-2], "--hot-experts", "36", "--draft-pruned", "21")
    assert code == 0
    assert "INT4 draft experts (7/64 per layer)" in pruned
    assert re.search(r"experts the draft skips \(pruned, per layer\) +21\n", pruned)
    assert slots(pruned) > slots(pinned)
    code, _, err = _run(capsys, *argv[:-2], "--hot-experts", "36", "--draft-pruned", "28")
    assert code == 2
    assert "pruned_experts_per_layer must be an int in [0, 28)" in err


def test_info_takes_the_pruned_count_bench_and_generate_take_by_default(capsys):
    # Default auto: E // 3 = 21 of DeepSeek-V2-Lite's 64 where 24 GB leaves experts slotless
    # (resolve_pruned_per_layer), the plan of `--draft-pruned 21`; none with every expert
    # resident; never so many that pinned experts leave no INT4 expert.
    from specter_models import get_preset, plan_memory, resolve_pruned_per_layer

    config = get_preset("deepseek-v2-lite").make_config()
    assert resolve_pruned_per_layer(config, 24, "auto") == 21
    assert resolve_pruned_per_layer(config, None, "auto") == 0
    assert resolve_pruned_per_layer(config, 24, 5) == 5
    assert plan_memory(config, 24).slots_per_layer < 64
    argv = ("info", "--model", "deepseek-v2-lite", "--gpu-memory-gb", "24")
    code, auto, _ = _run(capsys, *argv)
    assert code == 0
    code, explicit, _ = _run(capsys, *argv, "--draft-pruned", "21")
    assert code == 0
    assert auto.split("memory plan:")[1] == explicit.split("memory plan:")[1]
    assert re.search(r"experts the draft skips \(pruned, per layer\) +21\n", auto)
    code, out, _ = _run(
        capsys, "info", "--model", "deepseek-v2-lite", "--gpu-memory-gb", "unlimited"
    )
    assert code == 0
    assert "experts the draft skips" not in out
    code, out, _ = _run(capsys, *argv, "--hot-experts", "44")  # 44 + 21 would leave none
    assert code == 0
    assert re.search(r"experts the draft skips \(pruned, per layer\) +19\n", out)
    assert "INT4 draft experts (1/64 per layer)" in out
    code, out, _ = _run(capsys, *argv, "--draft-pruned", "auto", "--hot-experts", "36")
    assert code == 0
    assert "INT4 draft experts (7/64 per layer)" in out
    code, _, err = _run(capsys, *argv, "--draft-pruned", "some")
    assert code == 2
    assert "--draft-pruned" in err
    assert "'some'" in err


def test_info_counts_a_staging_buffer_as_fixed_state(capsys):
    argv = ("info", "--model", "deepseek-v2-lite", "--gpu-memory-gb", "24", "--hot-experts", "36")
    code, plain, _ = _run(capsys, *argv)
    assert code == 0
    code, staged, _ = _run(capsys, *argv, "--stream-staging", "8")
    assert code == 0
    assert "staging buffer" not in plain
    line = next(line for line in staged.splitlines() if line.startswith("staging buffer"))
    assert "(8 FP16 experts)" in line
    assert line.split()[-2:] == ["0.14", "GB"]  # 8 x 3 x 2048 x 1408 x 2 bytes: 138 MB


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
    assert json.loads(out.strip().splitlines()[-1])["new_tokens"] == 4
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
        runs[asked] = json.loads(out.strip().splitlines()[-1])
    assert runs["auto"]["draft_pruned_per_layer"] == runs["2"]["draft_pruned_per_layer"] == 2
    assert runs["0"]["draft_pruned_per_layer"] == 0
    assert runs["auto"]["hot_experts_per_layer"] == runs["0"]["hot_experts_per_layer"] == 2
    code, _, err = _run(capsys, *argv, "--draft-pruned", "3")
    assert code == 2
    assert "that file names 2 pruned experts per layer" in err
    path.write_text(json.dumps({"hot_experts": [[0, 1]] * layers}))  # none named: none pruned
    code, out, err = _run(capsys, *argv)
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1])["draft_pruned_per_layer"] == 0


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
    from specter_bench.model_loading import load_tokenizer

    ids = load_tokenizer("tiny-deepseek-v2", int(config.vocab_size)).encode(prompt)
    # ... and its greedy continuation's (3 tokens asked, fewer than CONTINUATION_TOKENS): every
    # position a decode of 3 tokens computes, so the last token's is not among them.
    assert tuple(routing.shape) == (len(ids) + 2, layers, config.num_experts_per_tok)
    assert "the routing of the prompt and its first 3 greedy tokens" in err
    assert seen["budget"] == budget
    stats = json.loads(out.strip().splitlines()[-1])
    assert stats["hot_set_choice_s"] > 0
    from specter_bench.cli import build_parser
    from specter_bench.hot_sets import CONTINUATION_TOKENS

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
    stats = json.loads(out.strip().splitlines()[-1])
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
    from specter_bench.text_generation import generate_hot_experts

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
        runs[extra] = (json.loads(out.strip().splitlines()[-1]), err)
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
    roomy_stats = json.loads(out.strip().splitlines()[-1])
    assert roomy_stats["slots_per_layer"] == roomy_stats["num_experts"]


def test_generate_hot_set_auto_needs_a_budget_and_two_tokens(capsys):
    code, _, err = _run(
        capsys, "generate", "--model", "tiny-deepseek-v2", "--max-new-tokens", "2",
        "--hot-experts", "auto", "hi",
    )  # fmt: skip
    assert code == 2
    assert "--hot-experts auto chooses a hot set for a memory budget" in err
    from specter_bench.hot_sets import choose_prompt_engine

    def never():
        raise AssertionError("the prompt is checked before anything loads")

    with pytest.raises(ValueError, match="needs at least 2 tokens; this prompt has 1"):
        choose_prompt_engine(never, 1.0, [5], dtype=torch.float32, max_seq_len=64)


def test_prompt_choice_routes_the_greedy_continuation_too():
    # choose_prompt_engine's continuation: the target-only load decodes it greedily and the
    # routing covers the prompt, then every generated token but the last.
    from specter_bench.engine_systems import ENGINE_SYSTEMS, EngineSystemRunner
    from specter_bench.hot_sets import choose_prompt_engine
    from specter_bench.model_loading import load_engine

    config = specter_models.preset_config("tiny-deepseek-v2")
    plan = specter_models.plan_memory(
        config, slots_per_layer=4, dtype=torch.float32, max_seq_len=64
    )
    budget = (plan.expected_peak_bytes + plan.expert_bytes) / 1e9

    def load():
        return load_engine(
            "tiny-deepseek-v2", budget_gb=budget, with_draft=False, policy="lru", device="cpu",
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
    tokens = EngineSystemRunner(loaded, ENGINE_SYSTEMS["lru"], 0).generate(prompt, 5).tokens
    from specter_bench.routing_recorder import RoutingRecorder, teacher_forced_pass

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
        lines = out.strip().splitlines()
        runs[depth] = (lines[:-1], json.loads(lines[-1]))
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
    assert "Without the INT4 draft it fits: --depth 0 decodes plainly with 1 FP16 expert" in err
    code, out, err = _run(capsys, *argv, "--depth", "0")
    assert code == 0, err
    assert json.loads(out.strip().splitlines()[-1])["slots_per_layer"] == 1
    code, _, err = _run(capsys, *argv[:-2], "0.000001", "hi", "--depth", "2")
    assert code == 2
    assert "too small" in err
    assert "Without the INT4 draft it fits" not in err  # plain decoding does not fit either
    assert "Without the INT4 draft (--depth 0, plain decoding) it does not fit either" in err


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
        lines = out.strip().splitlines()
        return lines[:-1], json.loads(lines[-1]), err

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
