"""specter info: the machine and a model's memory plan at a budget."""

import re

import torch

from specter_bench.cli import main


def _run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_info_prints_the_machine_and_the_memory_plan(capsys):
    code, out, _ = _run(
        capsys, "info", "--dtype", "float16", "--model", "deepseek-v2-lite", "--gpu-memory-gb", "24"
    )
    assert code == 0
    assert "GPU: none visible" in out or "GPU: " in out
    assert "versions: torch" in out
    host = re.search(r"host CPU: .+, \d+ cores, memory bandwidth ([\d.]+) GB/s", out)
    assert host is not None
    assert float(host.group(1)) > 0
    assert "memory plan: deepseek-v2-lite (deepseek_v2) at 24 GB" in out
    assert "INT4 draft experts" in out
    assert "per layer x 26 layers" in out
    plain = "without the INT4 draft (generate --depth 0): 46/64 FP16 expert slots per layer"
    assert plain in out  # the draft's memory, as slots
    # 4 GB holds the model without its draft only: info says why and shows that plan.
    code, out, _ = _run(
        capsys, "info", "--dtype", "float16", "--model", "deepseek-v2-lite", "--gpu-memory-gb", "4"
    )
    assert code == 0
    assert "with the INT4 draft: does not fit: gpu_memory_gb=4.0 is too small" in out
    assert "without the INT4 draft (generate --depth 0, plain decoding):" in out
    assert "none (no draft: plain decoding)" in out.split("plain decoding):")[1]
    assert "FP16 expert slots (1/64 per layer x 26 layers)" in out
    # 2 GB holds it neither way: both shortfalls, the speculative one first.
    code, _, err = _run(
        capsys, "info", "--dtype", "float16", "--model", "deepseek-v2-lite", "--gpu-memory-gb", "2"
    )
    assert code == 2
    speculative, plain = err.split("Without the INT4 draft (--depth 0, plain decoding)")
    assert "INT4 draft experts" in speculative
    needs = [float(m) for m in re.findall(r"needs at least ([0-9.]+) GB", err)]
    assert len(needs) == 2
    assert needs[1] < needs[0]  # plain decoding needs less: no INT4 draft
    assert "does not fit either" in plain


def test_info_shows_the_plan_with_a_pinned_hot_set(capsys):
    argv = (
        "info",
        "--dtype",
        "float16",
        "--model",
        "deepseek-v2-lite",
        "--gpu-memory-gb",
        "24",
        "--draft-pruned",
        "0",
    )
    code, plain, _ = _run(capsys, *argv)
    assert code == 0
    code, pinned, _ = _run(capsys, *argv, "--hot-experts", "36")
    assert code == 0
    assert "INT4 draft experts (64/64 per layer)" in plain
    assert "INT4 draft experts (28/64 per layer)" in pinned
    # Without a hot set the plan says that bench and generate pin one, and how to see it.
    assert "--hot-experts N shows the plan with N pinned" in plain
    assert "--hot-experts N shows" not in pinned
    code, unlimited, _ = _run(capsys, "info", "--dtype", "float16", "--model", "deepseek-v2-lite")
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
    argv = ("info", "--dtype", "float16", "--model", "deepseek-v2-lite", "--gpu-memory-gb", "24")
    code, auto, _ = _run(capsys, *argv)
    assert code == 0
    code, explicit, _ = _run(capsys, *argv, "--draft-pruned", "21")
    assert code == 0
    assert auto.split("memory plan:")[1] == explicit.split("memory plan:")[1]
    assert re.search(r"experts the draft skips \(pruned, per layer\) +21\n", auto)
    code, out, _ = _run(
        capsys,
        "info",
        "--dtype",
        "float16",
        "--model",
        "deepseek-v2-lite",
        "--gpu-memory-gb",
        "unlimited",
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
    argv = (
        "info",
        "--dtype",
        "float16",
        "--model",
        "deepseek-v2-lite",
        "--gpu-memory-gb",
        "24",
        "--hot-experts",
        "36",
    )
    code, plain, _ = _run(capsys, *argv)
    assert code == 0
    code, staged, _ = _run(capsys, *argv, "--stream-staging", "8")
    assert code == 0
    assert "staging buffer" not in plain
    line = next(line for line in staged.splitlines() if line.startswith("staging buffer"))
    assert "(8 FP16 experts)" in line
    assert line.split()[-2:] == ["0.14", "GB"]  # 8 x 3 x 2048 x 1408 x 2 bytes: 138 MB


def test_info_plans_the_models_positions_and_the_dtype_generate_loads(capsys):
    # specter-code-tiny has 1024 positions: the plan's KV cache holds those, not 2048.
    code, out, err = _run(capsys, "info")
    assert code == 0, err
    assert "KV cache (1024 positions)" in out
    assert "memory plan: specter-code-tiny" in out  # no --model: the default model's plan
    dtype = "float16" if torch.cuda.is_available() else "float32"
    assert f"memory plan: specter-code-tiny (deepseek_v2) at unlimited, {dtype}" in out
    assert "missing" not in out  # an absent optional package is not an error
    code, out, _ = _run(capsys, "info", "--max-seq-len", "256", "--dtype", "bfloat16")
    assert code == 0
    assert "KV cache (256 positions)" in out
    assert ", bfloat16" in out


def test_info_help_describes_every_option(capsys):
    import contextlib

    with contextlib.suppress(SystemExit):
        main(["info", "--help"])
    out = capsys.readouterr().out
    for flag in ("--model MODEL", "--gpu-memory-gb GPU_MEMORY_GB"):
        help_text = out.split(flag, 1)[1].split("\n  --", 1)[0]
        assert len(help_text.split()) > 3, flag


def test_info_says_what_gpu_memory_auto_chooses(capsys, monkeypatch):
    from specter_models.engine import auto_budget as auto_module
    from specter_models.engine import model_source

    code, out, _ = _run(capsys, "info", "--model", "tiny-qwen2-moe")
    assert code == 0
    if not torch.cuda.is_available():
        assert "--gpu-memory-gb auto: no GPU memory budget on the CPU" in out
    # With a GPU: free memory less the margin (faked: 6 GB free; deepseek-v2-lite needs more).
    monkeypatch.setattr(auto_module.torch.cuda, "mem_get_info", lambda device=None: (6e9, 8e9))
    monkeypatch.setattr(model_source, "resolve_device", lambda text: "cuda")
    code, out, err = _run(
        capsys, "info", "--model", "deepseek-v2-lite", "--gpu-memory-gb", "auto", "--dtype",
        "float16", "--draft-pruned", "0",
    )  # fmt: skip
    assert code == 0, err
    assert "--gpu-memory-gb auto: 4.50 GB budget = 6.00 GB free on cuda less a 1.5 GB margin" in out
    assert "at 4.5 GB" in out
