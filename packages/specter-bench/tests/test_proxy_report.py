"""scripts/proxy_report.py (the trained-proxies section) on synthetic records and logs."""

import importlib.util
import json
import random
import sys
from pathlib import Path

import pytest

from specter_bench.bench_record import ExperimentRecord

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "proxy_report.py"
pytestmark = pytest.mark.skipif(not SCRIPT.is_file(), reason="needs the workspace checkout")


@pytest.fixture(scope="module")
def report():
    spec = importlib.util.spec_from_file_location("proxy_report", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["proxy_report"] = module  # dataclasses look their module up while defining
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules["proxy_report"]


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def _row(text: str, *parts: str) -> list[str]:
    """The cells of the one table row holding every part."""
    (line,) = [
        ln for ln in text.splitlines() if ln.startswith("| ") and all(p in ln for p in parts)
    ]
    return _cells(line)


def _section(text: str, heading: str) -> str:
    """The text under ``### heading`` up to the next heading."""
    return text.split(f"### {heading}\n", 1)[1].split("\n### ", 1)[0]


def _write(path: Path, items: list[dict]) -> Path:
    path.write_text("".join(json.dumps(i) + "\n" for i in items))
    return path


def _bench(model: str, weights: str, rng: random.Random, layers: int) -> tuple[list[dict], dict]:
    identity = {
        "weights": weights,
        "gpu": "Test GPU",
        "prompt_source": "humaneval",
        "max_new_tokens": 16,
    }
    per_layer = [rng.uniform(0.3, 0.99) for _ in range(layers)]
    agreement = {
        "mean": sum(per_layer) / layers, "exact_rate": rng.random(), "per_layer": per_layer,
        "per_request": [0.5, 0.6], "greedy_agreement": rng.random(), "prompts": 2,
        "sampled_acceptance": rng.random(), "sampled_acceptance_t0.7": rng.random(),
    }  # fmt: skip
    means = sorted(rng.uniform(2, 60) for _ in range(4))
    out = [ExperimentRecord("routing_agreement", model, None, agreement, identity).as_dict()]
    for which in ("target", "draft"):
        curve = [{"depth": d, "mean": m} for d, m in zip((1, 2, 4, 8), means, strict=True)]
        data = {"routing": which, "prompts": 2, "tokens_per_prompt": 16, "curve": curve}
        out.append(ExperimentRecord("working_set", model, None, data, identity).as_dict())
    policies = {p: {"hit_rate": rng.random()} for p in ("lru", "lfu", "predictive", "belady")}
    data = {"window": 9, "slots_per_layer": 16, "num_experts": 64, "policies": policies}
    out.append(ExperimentRecord("policy_hit_rate", model, 0.5, data, identity).as_dict())
    return out, {"agreement": agreement, "means": means, "policies": policies}


def _training_log(arch: str, rng: random.Random) -> tuple[list[dict], dict]:
    losses = [8.3, rng.uniform(4, 5), rng.uniform(3, 4), rng.uniform(3.5, 4.5)]
    evals = [{"event": "eval", "step": 50 * i, "heldout_loss": v} for i, v in enumerate(losses)]
    best = min(evals, key=lambda e: e["heldout_loss"])
    log = [
        {"event": "config", "settings": {"arch": arch}, "device_name": "Test GPU"},
        {"event": "model", "parameters": 178_073_024},
        {"event": "schedule", "steps": 150},
        evals[0],
        *[{"event": "train", "step": s, "loss": 5.0, "tokens_per_s": t}
          for s, t in ((1, 10), (10, 300_000), (20, 500_000), (30, 400_000))],
        *evals[1:],
        {"event": "summary", "steps": 150, "schedule_steps": 150, "wall_s": 101.4,
         "epochs_seen": 2.2, "initial_heldout_loss": 8.3,
         "saved_heldout_loss": best["heldout_loss"], "saved_heldout_ppl": 40.1,
         "checks": {"a": True, "b": True}},
    ]  # fmt: skip
    return log, {"best": best}


def test_section_from_records_and_logs(report, tmp_path):
    rng = random.Random(5)
    proxy, facts = _bench("dsv2-proxy", "checkpoint /tmp/proxy/dsv2-proxy", rng, layers=26)
    random_dsv2, random_facts = _bench("deepseek-v2-lite", "random (seed 0)", rng, layers=26)
    log_dsv2, train_dsv2 = _training_log("dsv2-proxy", rng)
    log_phi, _ = _training_log("phi-proxy", rng)
    log_phi[-1]["checks"]["b"] = False
    bench_file = _write(tmp_path / "proxies.jsonl", proxy)
    random_file = _write(tmp_path / "random.jsonl", random_dsv2)
    # Two training logs concatenated in one file are told apart by their config events.
    training_file = _write(tmp_path / "training.jsonl", log_dsv2 + log_phi)
    md = tmp_path / "section.md"
    png = tmp_path / "ws.png"
    status = report.main([
        str(bench_file), str(training_file), "--random", str(random_file),
        "--markdown", str(md), "--plot", str(png), "--date", "2026-11-29",
    ])  # fmt: skip
    assert status == 0
    text = md.read_text()
    assert text.startswith("## Trained topology proxies (2026-11-29)")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "![distinct experts per layer against K](img/ws.png)" in text

    training = _section(text, "Training")
    row = _row(training, "`dsv2-proxy`")
    best = train_dsv2["best"]
    assert row[1:7] == ["178 M", "150", "150", "101", "400 k", "2.2"]  # median tokens/s
    assert row[8] == f"{best['heldout_loss']:.3f} (step {best['step']})"
    assert row[11] == "all passed"
    assert _row(training, "`phi-proxy`")[11] == "failed: b"

    a = facts["agreement"]
    worst = min(range(26), key=a["per_layer"].__getitem__)
    agreement = _section(text, "INT4 draft acceptance and routing agreement")
    row = _row(agreement, "`dsv2-proxy` (trained)")
    assert row[1:6] == [
        f"{a['greedy_agreement']:.3f}", f"{a['sampled_acceptance']:.3f}",
        f"{a['sampled_acceptance_t0.7']:.3f}", f"{a['mean']:.3f}", f"{a['exact_rate']:.3f}",
    ]  # fmt: skip
    assert row[6] == f"{a['per_layer'][worst]:.3f} (#{worst})"
    r = random_facts["agreement"]
    random_row = _row(agreement, "DeepSeek-V2-Lite (random)", "random.jsonl")
    assert random_row[1] == f"{r['greedy_agreement']:.3f}"
    # The figures quoted in BENCHMARK.md stand beside them, with their source.
    assert _row(agreement, "Phi-3.5-MoE (random)", "BENCHMARK.md")[1:3] == ["0.000", "0.398"]
    assert _row(agreement, "`qwen-proxy` (trained)")[-1] == "not measured"

    working_set = _section(text, "Distinct experts per layer against depth K")
    headers = _cells(next(ln for ln in working_set.splitlines() if ln.startswith("| model")))
    assert headers[2:8] == ["K=1", "K=2", "K=4", "K=8", "K=16", "K=32"]
    row = _row(working_set, "`dsv2-proxy` (trained)", "| draft |")
    assert row[2:6] == [f"{m:.3f}" for m in facts["means"]]
    assert row[6:8] == ["-", "-"]
    assert _row(working_set, "Qwen1.5-MoE-A2.7B (random)", "BENCHMARK.md")[2:8] == [
        "4.000", "-", "4.900", "-", "6.200", "7.700",
    ]  # fmt: skip
    assert _row(text, "`dsv2-proxy`", "16/64")[3:7] == [
        f"{facts['policies'][p]['hit_rate']:.3f}" for p in ("lru", "lfu", "predictive", "belady")
    ]
    per_layer = [ln for ln in text.splitlines() if ln.startswith("- `dsv2-proxy`:")]
    assert per_layer == ["- `dsv2-proxy`: " + " ".join(f"{v:.2f}" for v in a["per_layer"])]


def test_bad_input_is_refused(report, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind": "working_set"}\n{"neither": 1}\n')
    md = tmp_path / "out.md"
    assert report.main([str(bad), "--markdown", str(md), "--random", str(bad)]) == 2
    assert "bad.jsonl:2 has neither `kind`" in capsys.readouterr().err
    assert report.main([str(tmp_path / "missing.jsonl"), "--markdown", str(md)]) == 2
    assert not md.exists()
