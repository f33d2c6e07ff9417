"""specter bench, kernel-bench, profile-depth and report on tiny models."""

import json

import pytest
import torch

import specter_models
from specter_bench.cli import main


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


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
    from specter_bench.cli import build_parser
    from specter_bench.commands.bench import bench_config_from_args

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
    from specter_bench.cli import build_parser
    from specter_bench.commands.bench import bench_config_from_args
    from specter_bench.experiments import DEFAULT_CALIBRATION_PROMPTS, BenchConfig

    args = build_parser().parse_args(["bench", "--model", "tiny-qwen2-moe", *argv])
    config = bench_config_from_args(args, "cpu")
    want = DEFAULT_CALIBRATION_PROMPTS if expected is None else expected
    assert config.calibration_prompts == want
    assert BenchConfig.calibration_prompts == DEFAULT_CALIBRATION_PROMPTS == 8


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


def test_bench_headline_options_reach_the_config():
    from specter_bench.cli import build_parser
    from specter_bench.commands.bench import bench_config_from_args

    parser = build_parser()
    argv = [
        "bench", "--model", "deepseek-v2-lite", "--experiment", "tpot", "--systems",
        "specter,offload,lru", "--budgets", "16,24,unlimited", "--prompts", "humaneval, prose",
        "--num-prompts", "10", "--max-new-tokens", "128", "--runs", "3",
    ]  # fmt: skip
    config = bench_config_from_args(parser.parse_args(argv), "cpu")
    assert (config.runs, config.max_new_tokens, config.fallback) == (3, 128, True)
    assert not bench_config_from_args(parser.parse_args([*argv, "--no-fallback"]), "cpu").fallback
    assert (config.prompts.source, config.prompts.limit) == ("humaneval,prose", 10)
    assert config.systems == ("specter", "offload", "lru")
    ttft = ["bench", "--model", "m", "--experiment", "ttft", "--prompt-lengths", "512,2048"]
    config = bench_config_from_args(parser.parse_args(ttft), "cpu")
    assert (config.experiment, config.prompt_lengths, config.runs) == ("ttft", (512, 2048), 1)
    default = bench_config_from_args(parser.parse_args(["bench", "--model", "m"]), "cpu")
    assert default.prompt_lengths == (512, 2048, 8192)
    assert (default.max_prompt_tokens, default.prompts.limit) == (512, 3)


def test_bench_batch_options_reach_the_config():
    from specter_bench.cli import build_parser
    from specter_bench.commands.bench import bench_config_from_args

    parser = build_parser()
    argv = ["bench", "--model", "deepseek-v2-lite", "--experiment", "batch"]
    config = bench_config_from_args(parser.parse_args(argv), "cpu")
    # The paper's protocol: 16-token prefixes, 128 new tokens, B up to 32 distinct prompts.
    assert config.batch_sizes == (1, 2, 4, 8, 16, 32)
    assert (config.max_prompt_tokens, config.max_new_tokens, config.prompts.limit) == (16, 128, 32)
    config = bench_config_from_args(
        parser.parse_args([*argv, "--batch-sizes", "1,4", "--max-prompt-tokens", "64"]), "cpu"
    )
    assert (config.batch_sizes, config.max_prompt_tokens, config.prompts.limit) == ((1, 4), 64, 4)


def test_bench_batch_needs_as_many_prompts_as_its_largest_batch(capsys, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"x = {i}"}) + "\n" for i in range(2)))
    code, _, err = _run(
        capsys, "bench", "--model", "tiny-qwen2-moe", "--device", "cpu", "--experiment", "batch",
        "--batch-sizes", "1,4", "--prompts", "jsonl", "--prompts-path", str(prompts),
        "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 2
    assert "gave 2, fewer than the largest batch size 4: give --num-prompts 4" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--prompts", "humaneval,wiki"], "unknown prompt source 'wiki'"),
        (["--runs", "0"], "expected an int >= 1, got '0'"),
        (["--systems", "specter-plain-pipe"], "'specter-plain-pipe' no longer runs; use offload"),
        (["--experiment", "ttft", "--systems", "hf"], "the ttft experiment measures engine"),
        (["--experiment", "batch", "--batch-sizes", "1,0"], "expected a comma-separated list of"),
        (["--experiment", "batch", "--batch-sizes", "two"], "ints >= 1 such as 1,2,4,8,16,32"),
        (["--batch-sizes", "1,2"], "add --experiment batch"),
        (["--experiment", "batch", "--systems", "spec-lru"], "measures specter, offload, hf"),
    ],
)
def test_bench_rejects_bad_headline_options_in_one_line(capsys, argv, message):
    code, _out, err = _run(capsys, "bench", "--model", "tiny-qwen2-moe", "--device", "cpu", *argv)
    assert code == 2
    assert message in err
    assert "Traceback" not in err


def test_bench_refuses_bad_cpu_thread_lists(capsys):
    import os

    cores = os.cpu_count() or 1
    code, _, err = _run(
        capsys, "bench", "--model", "tiny-qwen2-moe", "--cpu-threads", f"1,{cores + 1}"
    )
    assert code == 2
    assert f"from 1 to this machine's {cores} cores" in err
    code, _, err = _run(capsys, "bench", "--model", "tiny-qwen2-moe", "--cpu-experts", "off,maybe")
    assert code == 2
    assert "expected auto, off or on" in err
