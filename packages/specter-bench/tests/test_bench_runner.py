"""The default experiment end to end on a tiny model (CPU, float64): records, checks, report."""

import itertools
import json
import statistics
from pathlib import Path

import pytest
import torch

from specter_bench.bench_record import read_records
from specter_bench.bench_runner import BenchRunner
from specter_bench.engine_systems import ENGINE_SYSTEMS
from specter_bench.experiments import ABLATIONS, BenchConfig
from specter_bench.prompt_sources import PromptSourceConfig
from specter_bench.report import write_report
from specter_bench.system_run import first_mismatch

NEW_TOKENS = 12
SWEEP = (0, 2, 3)


def _prompts(tmp: Path) -> PromptSourceConfig:
    """Two measured prompts, then two more: the calibration prompts of the hot sets."""
    path = tmp / "prompts.jsonl"
    rows = [
        {"id": "a", "text": "def add(a, b):\n    return"},
        {"id": "b", "text": "import os\nfor name in os.listdir('.'):\n"},
        {"id": "c", "text": "class Stack:\n    def push(self, item):\n"},
        {"id": "d", "text": "while True:\n    line = input()\n"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return PromptSourceConfig("jsonl", str(path), field="text", limit=2)


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    config = BenchConfig(
        model="tiny-deepseek-v2",
        prompts=_prompts(tmp),
        max_new_tokens=NEW_TOKENS,
        max_prompt_tokens=40,
        depth=3,
        sweep_depths=SWEEP,
        working_set_depths=(1, 2, 4, 8),
        device="cpu",
        dtype=torch.float64,
        seed=2,
        out_dir=tmp / "results",
        tag="test",
        command="specter bench --model tiny-deepseek-v2",
    )
    runner = BenchRunner(config, progress=False, log=lambda line: None)
    return runner, runner.run()


def test_every_record_kind_is_written_and_readable(default_run):
    runner, result = default_run
    assert result.path.name == "bench-tiny-deepseek-v2-test.jsonl"
    assert result.skipped == []
    assert read_records(result.path) == json.loads(json.dumps(result.records))
    kinds = {r["kind"] for r in result.records}
    assert kinds == {
        "tpot", "memory", "working_set", "routing_agreement", "policy_hit_rate", "depth_sweep",
        "hot_experts", "hot_sweep",
    }  # fmt: skip
    assert {r["prompt_id"] for r in result.records if r["kind"] == "tpot"} == {"a", "b"}
    low, high = runner.budgets[:2]
    assert low < high
    assert runner.budgets[2] is None
    cells = {(r["system"], r["budget_gb"]) for r in result.records if r["kind"] == "tpot"}
    expected = {("hf", None), ("hf-default", None)}
    for budget in (None, low, high):
        expected |= {(s, budget) for s in ("offload", "lru", "spec-lru", "specter")}
    expected |= {(system, high) for system in ABLATIONS}
    assert cells == expected


def test_every_system_decodes_what_hf_decodes(default_run):
    _, result = default_run
    tpot = [r for r in result.records if r["kind"] == "tpot"]
    assert len(tpot) == 2 * (2 + 4 * 3 + len(ABLATIONS))  # hf twice, 3 budgets, ablations
    for r in tpot:
        assert r["new_tokens"] == NEW_TOKENS
        assert r["tpot_ms"] > 0
        assert r["identity"]["weights"] == "random (seed 2)"
        assert r["identity"]["command"] == "specter bench --model tiny-deepseek-v2"
        if r["system"] == "hf":
            assert r["reference_system"] is None
            continue
        assert r["reference_system"] == "hf"
        assert r["matches_reference"] is True, (r["system"], r["budget_gb"], r["first_mismatch"])
        assert r["first_mismatch"] is None


def test_engine_systems_are_checked_against_the_first_engine_decode(default_run):
    _, result = default_run
    tpot = [r for r in result.records if r["kind"] == "tpot"]
    for prompt in {r["prompt_id"] for r in tpot}:
        mine = [r for r in tpot if r["prompt_id"] == prompt]
        engine = [r for r in mine if not r["system"].startswith("hf")]
        first = engine[0]  # records are written in decode order
        assert first["engine_reference_system"] is None
        assert first["matches_engine_reference"] is None
        for r in engine[1:]:
            assert r["engine_reference_system"] == first["system"]
            assert r["matches_engine_reference"] is True, (r["system"], r["budget_gb"])
            assert r["extra"]["tokens"] == first["extra"]["tokens"]
        for r in mine:
            if r["system"].startswith("hf"):
                assert r["matches_engine_reference"] is None
            assert len(r["extra"]["tokens"]) == r["new_tokens"]


def test_engine_records_hold_cache_acceptance_and_the_belady_bound(default_run):
    runner, result = default_run
    k = runner.hf_config.num_experts_per_tok
    for r in result.records:
        if r["kind"] != "tpot" or r["system"].startswith("hf"):
            continue
        layers = len(r["slots_per_layer"])
        if ENGINE_SYSTEMS[r["system"]].speculate:
            assert 0 < r["depth"] <= 3  # K = 3, shortened only where the token budget ends
            assert 0 <= r["acceptance_rate"] <= 1
            assert r["draft_ms_per_token"] > 0
        if r["budget_gb"] is None:
            # Every expert resident: nothing moves, and specter-models' all-resident fast
            # path keeps no cache bookkeeping, so no hit is counted (None) or all are (1.0).
            assert r["hit_rate"] in (None, 1.0)
            assert r["h2d_bytes_per_token"] in (None, 0)
            continue
        assert 0 <= r["hit_rate"] <= 1
        bound = r["extra"]["belady"]
        assert bound["slots_per_layer"] == r["slots_per_layer"]
        assert bound["accesses"] == NEW_TOKENS * layers * k
        assert r["belady_tpot_ms"] == pytest.approx(
            1e3 * bound["loads"] * bound["expert_transfer_s"] / NEW_TOKENS
        )
        if bound["loads"]:
            assert r["tpot_over_belady"] == pytest.approx(r["tpot_ms"] / r["belady_tpot_ms"])
        # Plain decoding loads no fewer experts than Belady's per-token bound allows. (A
        # verification loads an expert once for all its rows, so a speculating system with
        # few evictable slots, as beside a hot set here, can go below a per-token bound.)
        cache = r["extra"]["cache"]
        if r["system"] == "lru":
            assert cache["demand_loads"] + cache["prefetch_loads"] >= bound["loads"]
    high = runner.budgets[1]
    slots = {
        r["system"]: r["slots_per_layer"][0]
        for r in result.records
        if r["kind"] == "tpot" and r["budget_gb"] == high
    }
    # lru loads no INT4 draft: at the same budget it has at least as many slots.
    assert slots["lru"] >= slots["specter"]


def test_routing_experiments(default_run):
    runner, result = default_run
    k = runner.hf_config.num_experts_per_tok
    E = runner.hf_config.n_routed_experts
    by_kind = {}
    for r in result.records:
        by_kind.setdefault(r["kind"], []).append(r)
    ws = {r["data"]["routing"]: r["data"] for r in by_kind["working_set"]}
    assert set(ws) == {"target", "draft"}
    curve = ws["target"]["curve"]
    assert [p["depth"] for p in curve] == [1, 2, 4, 8]
    assert curve[0]["mean"] == curve[0]["minimum"] == k
    assert all(a["mean"] <= b["mean"] for a, b in itertools.pairwise(curve))
    assert curve[-1]["maximum"] <= E
    (agreement,) = by_kind["routing_agreement"]
    d = agreement["data"]
    assert 0 <= d["mean"] <= 1
    assert len(d["per_request"]) == 2
    assert len(d["per_layer"]) == len(runner.routing["a"]["target"][0])
    assert 0 <= d["greedy_agreement"] <= 1
    assert d["greedy_agreement"] == pytest.approx(
        statistics.fmean(d["per_request_greedy_agreement"])
    )
    # The INT4 draft is not the target: its distributions differ, so acceptance is below 1.
    for key in ("sampled_acceptance", "sampled_acceptance_t0.7"):
        per_request = d[f"per_request_{key}"]
        assert len(per_request) == 2
        assert all(0 < a < 1 for a in per_request)
        assert d[key] == pytest.approx(statistics.fmean(per_request))
    policies = by_kind["policy_hit_rate"]
    assert {(r["budget_gb"], r["data"]["window"]) for r in policies} == {
        (b, w) for b in runner.budgets[:2] for w in (1, 4)
    }
    for r in policies:
        rates = r["data"]["policies"]
        choice = runner.hot_choices[r["budget_gb"]]
        assert set(rates) == {"lru", "lfu", "predictive", "belady"} | (
            {"pinned", "belady_pinned_slots"} if choice.per_layer else set()
        )
        for name in ("lru", "lfu", "predictive"):
            assert rates[name]["loads"] >= rates["belady"]["loads"]
            assert rates[name]["accesses"] == rates["belady"]["accesses"]
        if not choice.per_layer:
            assert "pinned" not in r["data"]
            continue
        # The budget's hot set replays the same steps with the slots its INT4 savings buy.
        assert rates["pinned"]["accesses"] == rates["belady"]["accesses"]
        conf = r["data"]["pinned"]
        assert conf == {
            "experts_per_layer": choice.per_layer, "slots_per_layer": choice.slots_per_layer
        }  # fmt: skip
        assert conf["slots_per_layer"] >= r["data"]["slots_per_layer"]
        # Belady at the pinned plan's slots, warm-started: no more loads than the pinned LRU.
        assert rates["belady_pinned_slots"]["loads"] <= rates["pinned"]["loads"]
        assert rates["belady_pinned_slots"]["accesses"] == rates["pinned"]["accesses"]
    (sweep,) = by_kind["depth_sweep"]
    points = sweep["data"]["points"]
    assert [p["depth"] for p in points] == list(SWEEP)
    assert sweep["budget_gb"] == runner.budgets[1]
    assert sweep["data"]["best_depth"] == min(points, key=lambda p: p["tpot_ms"])["depth"]
    assert points[0]["acceptance_rate"] is None  # K = 0 proposes nothing
    for p in points:  # each prompt's own time, whose mean is the point's
        assert len(p["prompt_tpot_ms"]) == p["prompts"]
        assert p["tpot_ms"] == pytest.approx(sum(p["prompt_tpot_ms"].values()) / p["prompts"])
    memory = by_kind["memory"]
    # One per engine load: at each budget the hot-set draft (specter), the plain draft
    # (spec-lru), offload's draftless load and lru's, less unlimited's three (every system
    # shares the all-resident load), plus the ablations with and without a hot set (and the
    # sweep) at the high budget, and specter-staged's own load there.
    assert len(memory) == 12
    for r in memory:
        assert r["data"]["expected_peak_gb"] > r["data"]["slots_gb"] > 0


def test_each_budget_pins_the_hot_set_its_calibration_chose(default_run):
    runner, result = default_run
    chosen = [r for r in result.records if r["kind"] == "hot_experts"]
    hot = {r["budget_gb"]: r["data"] for r in chosen if r["data"].get("with_draft", True)}
    plain = {r["budget_gb"]: r["data"] for r in chosen if not r["data"].get("with_draft", True)}
    assert set(hot) == set(plain) == set(runner.budgets[:2])  # the finite budgets
    for data in [*hot.values(), *plain.values()]:
        assert data["calibration_prompts"] == ["c", "d"]  # after the measured prompts
        assert data["calibration_tokens"] == [NEW_TOKENS, NEW_TOKENS]
        assert data["loads"][str(data["per_layer"])] == min(data["loads"].values())
        assert len(data["hot_experts"]) == runner.hf_config.num_hidden_layers - 1  # MoE layers
        assert all(len(layer) == data["per_layer"] for layer in data["hot_experts"])
    for r in result.records:
        if r["kind"] != "tpot" or r["system"].startswith("hf") or r["budget_gb"] is None:
            continue
        pinned = r["extra"]["settings"]["hot_experts_per_layer"]
        if r["system"] == "offload":  # its own choice, among the draftless slots
            assert plain[r["budget_gb"]]["window"] == 1
            assert pinned == plain[r["budget_gb"]]["per_layer"]
            assert r["slots_per_layer"][0] == plain[r["budget_gb"]]["slots_per_layer"]
        elif ENGINE_SYSTEMS[r["system"]].hot_experts:
            assert pinned == hot[r["budget_gb"]]["per_layer"]
            assert r["slots_per_layer"][0] == hot[r["budget_gb"]]["slots_per_layer"]
        else:
            assert pinned == 0


def test_only_specter_fill_fills(default_run):
    _, result = default_run
    seen = set()
    for r in result.records:
        if r["kind"] != "tpot" or r["budget_gb"] is None or r["system"].startswith("hf"):
            continue
        settings, cache = r["extra"]["settings"], r["extra"]["cache"]
        if settings["miss_path"] != "stream":
            assert settings["stream_fills"] is None
            assert cache["streamed_fills"] == 0
            continue
        seen.add(r["system"])
        assert settings["stream_staging"] == 0  # float64: specter-staged runs unstaged
        fills = r["system"] in ("specter-fill", "offload")
        assert settings["stream_fills"] == (8 if fills else 0)
        if not fills:
            assert cache["streamed_fills"] == 0
        assert cache["streamed_fills"] <= cache["streamed_reads"]
    assert {"specter", "specter-fill", "specter-staged", "offload"} <= seen
    fills = [
        r["extra"]["cache"]["streamed_fills"]
        for r in result.records
        if r["kind"] == "tpot" and r["system"] == "specter-fill" and r["budget_gb"] is not None
    ]
    assert sum(fills) > 0  # a budget small enough to stream fills some slots


def test_the_hot_count_sweep_loads_each_count_and_keeps_greedy_tokens(default_run):
    runner, result = default_run
    (sweep,) = [r for r in result.records if r["kind"] == "hot_sweep"]
    high = runner.budgets[1]
    assert sweep["budget_gb"] == high
    chosen = runner.hot_choices[high]
    points = sweep["data"]["points"]
    counts = [p["hot_experts_per_layer"] for p in points]
    assert counts == sorted(set(counts))
    assert 0 in counts
    assert sweep["data"]["chosen"] == chosen.per_layer
    assert chosen.per_layer in counts
    assert len(counts) >= 2
    for p in points:
        assert p["tpot_ms"] > 0
        assert p["prompts"] == 2
        assert p["matches_engine"] == [True, True]  # pinning never changes a greedy token
        assert p["replayed_loads"] == chosen.loads.get(p["hot_experts_per_layer"])
    by_count = {p["hot_experts_per_layer"]: p for p in points}
    assert by_count[chosen.per_layer]["slots_per_layer"] == chosen.slots_per_layer
    # More pins free more INT4 memory: never fewer slots.
    slots = [p["slots_per_layer"] for p in points]
    assert slots == sorted(slots)
    memory_loads = [r for r in result.records if r["kind"] == "memory"]
    assert len(memory_loads) == 12  # the sweep's loads record no memory accounting


def test_report_from_the_records(default_run, tmp_path):
    _, result = default_run
    page = tmp_path / "docs" / "benchmarks.md"
    page.parent.mkdir()
    page.write_text("# Benchmarks\n\nHand-written intro.\n")
    write_report([result.path], page)
    text = page.read_text()
    assert text.startswith("# Benchmarks\n\nHand-written intro.\n")
    for title in (
        "### Targets", "### TPOT per system", "### Latency per phase", "### Memory accounting",
        "### Expert working set against depth K", "### Draft/target routing agreement",
        "### Cache hit rate per policy", "### Depth sweep", "### Hot sets", "### Hot-count sweep",
    ):  # fmt: skip
        assert title in text
    assert "specter bench --model tiny-deepseek-v2" in text
    for png in ("tpot_per_system", "working_set", "policy_hit_rate", "depth_sweep"):
        data = (page.parent / "img" / f"{png}.png").read_bytes()
        assert data.startswith(b"\x89PNG")
        assert f"](img/{png}.png)" in text
    write_report([result.path], page)  # regenerating replaces the section, keeps the intro
    assert page.read_text() == text


def test_time_limit_stops_cleanly(tmp_path):
    config = BenchConfig(
        model="tiny-qwen2-moe",
        experiment="tpot",
        prompts=_prompts(tmp_path),
        max_new_tokens=4,
        device="cpu",
        dtype=torch.float64,
        out_dir=tmp_path,
        tag="late",
        max_minutes=0.0,
        budgets=(None,),
    )
    result = BenchRunner(config, progress=False, log=lambda line: None).run()
    assert {r["kind"] for r in result.records} == {"skipped"}
    assert all("--max-minutes" in r["data"]["reason"] for r in result.records)
    assert len(result.skipped) == len(result.records) == 2  # the hf and engine stages
    assert [r["data"]["systems"] for r in result.records] == [
        ["hf", "hf-default"],
        ["specter", "spec-lru", "offload", "lru"],
    ]


def test_report_drops_skips_that_another_run_measured():
    from specter_bench.report import _measured_elsewhere

    def tpot(system, budget=None):
        return {"kind": "tpot", "model": "m", "budget_gb": budget, "system": system}

    what = "engine stage at unlimited (specter, lru)"
    skip = {"kind": "skipped", "model": "m", "budget_gb": None,
            "data": {"what": what, "systems": ["specter", "lru"]}}  # fmt: skip
    assert not _measured_elsewhere(skip, [skip, tpot("specter")])  # lru still missing
    assert not _measured_elsewhere(skip, [skip, tpot("specter"), tpot("lru", 24.0)])
    assert _measured_elsewhere(skip, [skip, tpot("specter"), tpot("lru")])
    old = {**skip, "data": {"what": "offload stage at 16 GB (hf-offload)", "reason": "late"},
           "budget_gb": 16.0}  # fmt: skip
    assert _measured_elsewhere(old, [old, tpot("hf-offload", 16.0)])  # parsed from "what"
    assert not _measured_elsewhere(old, [old, tpot("hf-offload")])
    policy = {**skip, "data": {"what": "policy replay", "reason": "late"}}
    assert not _measured_elsewhere(policy, [policy, tpot("specter"), tpot("lru")])


def test_first_mismatch():
    assert first_mismatch([1, 2, 3], [1, 2, 3]) is None
    assert first_mismatch([1, 5, 3], [1, 2, 3]) == 1
    assert first_mismatch([1, 2], [1, 2, 3]) == 2


def test_a_compiled_system_is_warmed_on_each_prompt_before_its_measured_run(default_run):
    from specter_bench.bench_support import PROMPT_WARMUP_TOKENS

    runner, _ = default_run
    calls = []

    class Run:
        def __init__(self, number):
            self.number, self.settings = number, {}

    def generate(ids, n):
        calls.append((tuple(ids), n))
        return Run(len(calls))

    class Bar:
        def update(self, n):
            pass

        def set_postfix_str(self, text):
            pass

    prompts = runner.prompts
    for warm_each in (False, True):
        calls.clear()
        runs = runner._decode_all(
            "hf", generate, NEW_TOKENS, prompts, Bar(), None, None, warm_each_prompt=warm_each
        )
        first = (tuple(prompts[0].ids), min(NEW_TOKENS, runner.config.warmup_tokens))
        measured = [(tuple(p.ids), NEW_TOKENS) for p in prompts]
        if warm_each:
            warm = [(tuple(p.ids), PROMPT_WARMUP_TOKENS) for p in prompts]
            assert calls == [first, warm[0], measured[0], warm[1], measured[1]]
        else:
            assert calls == [first, *measured]
        # The measured runs are the recorded ones, never a warm-up.
        assert [run.number for _, run in runs] == ([3, 5] if warm_each else [2, 3])
