"""``specter bench --routing replay`` on a tiny model (CPU): every engine system decodes the
trace's sequences, the routing experiments and the hot sets use the trace's routing, and
every record says so."""

import json
import statistics

import pytest
import torch

from specter_bench.bench_runner import BenchRunner
from specter_bench.cli import main
from specter_bench.experiments import BenchConfig
from specter_bench.prompt_sources import PromptSourceConfig
from specter_bench.routing_dump import RoutingDumpConfig, record_routing_dump
from specter_bench.tpot_tables import tpot_table

NEW_TOKENS = 10
TEXTS = ("def add(a, b):\n    return", "import os\n", "class Stack:\n", "while True:\n")


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory):
    """Four sequences of tiny-deepseek-v2 (seed 0), NEW_TOKENS + 3 continuation tokens."""
    tmp = tmp_path_factory.mktemp("replay")
    prompts = tmp / "prompts.jsonl"
    rows = [{"id": f"p{i}", "text": text} for i, text in enumerate(TEXTS)]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = RoutingDumpConfig(
        model="tiny-deepseek-v2",
        prompts=PromptSourceConfig("jsonl", str(prompts), field="text", limit=4),
        max_new_tokens=NEW_TOKENS,
        lookahead=3,
        device="cpu",
    )
    trace = record_routing_dump(config, log=lambda line: None)
    path = tmp / "trace.pt"
    trace.save(path)
    return path


def _config(trace_path, tmp, **changes) -> BenchConfig:
    base = {
        "model": "tiny-deepseek-v2",
        "experiment": "routing",
        "systems": ("specter", "lru"),
        "prompts": PromptSourceConfig(limit=2),
        "max_new_tokens": NEW_TOKENS,
        "depth": 3,
        "device": "cpu",
        "dtype": torch.float64,
        "seed": 5,  # other weights than the recorded model's
        "out_dir": tmp,
        "tag": "replay",
        "calibration_prompts": 2,
        "routing_trace": trace_path,
    }
    return BenchConfig(**{**base, **changes})


@pytest.fixture(scope="module")
def replay_run(trace_path, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    high = BenchRunner(_config(trace_path, tmp), progress=False, log=lambda line: None).budgets[1]
    config = _config(trace_path, tmp, budgets=(high,))
    runner = BenchRunner(config, progress=False, log=lambda line: None)
    return runner, runner.run()


def test_every_engine_system_decodes_the_traces_sequences(replay_run):
    runner, result = replay_run
    trace = runner.trace
    tpot = [r for r in result.records if r["kind"] == "tpot"]
    assert {r["system"] for r in tpot} == {"specter", "lru"}
    assert {r["prompt_id"] for r in tpot} == {"p0", "p1"}  # sequences 0 and 1
    by_id = {s.prompt_id: s for s in trace.sequences}
    for r in tpot:
        sequence = by_id[r["prompt_id"]]
        P = sequence.prompt_len
        assert r["prompt_tokens"] == P
        assert r["extra"]["tokens"] == sequence.tokens[P : P + NEW_TOKENS].tolist()
        assert r["prompt_source"] == "jsonl"
    assert all(r["identity"]["routing"] == "replay:trace.pt" for r in result.records)
    assert all(r["identity"]["prompt_source"] == "jsonl" for r in result.records)
    assert "tiny-deepseek-v2 (replay:trace.pt)" in tpot_table(tpot)


def test_the_routing_experiments_and_hot_sets_use_the_traces_routing(replay_run):
    runner, result = replay_run
    trace = runner.trace
    by_kind = {}
    for r in result.records:
        by_kind.setdefault(r["kind"], []).append(r)
    # The teacher-forced routing of each measured prompt is the trace's decode routing.
    for sequence in trace.sequences[:2]:
        start = sequence.prompt_len - 1
        recorded = runner.routing[sequence.prompt_id]
        expected = sequence.target[start : start + NEW_TOKENS].long()
        assert torch.equal(recorded["target"], expected)
        assert torch.equal(recorded["draft"], sequence.draft[start : start + NEW_TOKENS].long())
    (agreement,) = by_kind["routing_agreement"]
    flags = [
        float(s.agree[s.prompt_len - 1 : s.prompt_len - 1 + NEW_TOKENS].double().mean())
        for s in trace.sequences[:2]
    ]
    assert agreement["data"]["per_request_greedy_agreement"] == pytest.approx(flags)
    assert agreement["data"]["greedy_agreement"] == pytest.approx(statistics.fmean(flags))
    assert "sampled_acceptance" not in agreement["data"]
    (hot,) = by_kind["hot_experts"]
    assert hot["data"]["calibration_prompts"] == ["p2", "p3"]  # the sequences after them
    assert hot["data"]["calibration_tokens"] == [NEW_TOKENS, NEW_TOKENS]


def test_a_trace_that_does_not_fit_the_run_is_refused(trace_path, tmp_path):
    with pytest.raises(ValueError, match=r"recorded on tiny-deepseek-v2 with 2 MoE layers"):
        BenchRunner(_config(trace_path, tmp_path, model="tiny-qwen2-moe"), progress=False)
    with pytest.raises(ValueError, match=r"\d+ continuation tokens; decoding 20 new tokens"):
        BenchRunner(_config(trace_path, tmp_path, max_new_tokens=20), progress=False)
    with pytest.raises(ValueError, match=r"--num-prompts 6: routing trace trace\.pt holds 4"):
        BenchRunner(_config(trace_path, tmp_path, prompts=PromptSourceConfig(limit=6)))
    with pytest.raises(ValueError, match="hf run transformers' own routing"):
        _config(trace_path, tmp_path, systems=("hf", "specter"))


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--routing", "replay"], "--routing replay needs --routing-trace PATH"),
        (["--routing-trace", "t.pt"], "--routing-trace t.pt needs --routing replay"),
        (["--routing", "replay", "--routing-trace", "none.pt"], "none.pt does not exist"),
        (
            ["--experiment", "ttft", "--routing", "replay", "--routing-trace", "t.pt"],
            "--experiment ttft measures synthetic prompts",
        ),
    ],
)
def test_routing_flags_are_checked(capsys, flags, message):
    assert main(["bench", "--model", "tiny-deepseek-v2", "--device", "cpu", *flags]) == 2
    assert message in capsys.readouterr().err


def test_replay_order_takes_the_sources_in_turn():
    from specter_bench.bench_replay import replay_order

    assert replay_order(["h", "h", "h", "p", "p"]) == [0, 3, 1, 4, 2]
    assert replay_order(["p", "h", "p", "h"]) == [0, 1, 2, 3]
    assert replay_order(["h"] * 3) == [0, 1, 2]
