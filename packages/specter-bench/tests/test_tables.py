"""Markdown tables: summaries equal the means of the records, targets evaluated as stated."""

import statistics

import pytest

from bench_fixtures import experiment_records, tpot_records
from specter_bench.bench_record import TpotRecord
from specter_bench.tables import (
    Target,
    agreement_table,
    evaluate_targets,
    markdown_table,
    policy_table,
    summarize_tpot,
    targets_table,
    tpot_table,
    working_set_table,
)

REFERENCE_TARGETS = (
    Target("specter", "lru", 1 / 2, "<= 1/2", 24.0, "deepseek-v2-lite"),
    Target("specter", "spec-lru", 2 / 3, "<= 2/3", 24.0, "deepseek-v2-lite"),
    Target("specter", "belady", 1.5, "<= 1.5", 24.0, "deepseek-v2-lite"),
    Target("specter", "hf", 1 / 3, "<= 1/3", None, "deepseek-v2-lite"),
)
"""Ratios against the textbook references (reported, not product targets): they exercise
the pairing, run and Belady rules on cells every fixture measures."""


def test_markdown_table_layout():
    text = markdown_table(["name", "value"], [["a|b", 1.23456], ["c", None]])
    lines = text.splitlines()
    assert lines[0] == "| name | value |"
    assert lines[1] == "|---|---:|"
    assert lines[2] == "| a\\|b | 1.23 |"
    assert lines[3] == "| c | - |"
    with pytest.raises(ValueError, match="2 headers"):
        markdown_table(["a", "b"], [[1]])


def test_summaries_are_medians_and_means_over_prompts():
    records = tpot_records(seed=11)
    summaries = summarize_tpot(records)
    assert len(summaries) == 2 * (3 * 3 + 1)  # models x (budgets x 3 systems + hf once)
    for s in summaries:
        mine = [
            r
            for r in records
            if (r["model"], r["budget_gb"], r["system"]) == (s.model, s.budget_gb, s.system)
        ]
        assert s.prompts == len(mine) == 3
        assert s.tpot_ms == pytest.approx(statistics.median(r["tpot_ms"] for r in mine))
        assert s.prefill_ms == pytest.approx(statistics.fmean(r["prefill_ms"] for r in mine))
        assert s.mismatches == sum(r["matches_reference"] is False for r in mine)
        assert s.engine_mismatches == sum(r["matches_engine_reference"] is False for r in mine)
        assert s.engine_checked == (0 if s.system in ("hf", "lru") else 3)
        if s.system == "hf":
            assert s.hit_rate is None
            assert s.checked == 0
        else:
            assert s.hit_rate == pytest.approx(statistics.fmean(r["hit_rate"] for r in mine))
            expected = statistics.fmean(r["h2d_bytes_per_token"] for r in mine) / 1e6
            assert s.h2d_mb_per_token == pytest.approx(expected)
    # Order: model, then budgets ascending with unlimited last, then the systems' order.
    first = [(s.budget_gb, s.system) for s in summaries if s.model == "deepseek-v2-lite"]
    assert first[:3] == [(16.0, "lru"), (16.0, "spec-lru"), (16.0, "specter")]
    assert first[-1] == (None, "specter")
    table = tpot_table(records)
    assert table.count("\n") == len(summaries) + 2
    assert f"{summaries[0].tpot_ms:.2f}" in table.splitlines()[2]


def test_targets_compare_the_right_cells():
    records = tpot_records(seed=12, models=("deepseek-v2-lite",))
    by = {s.__dict__["system"] + str(s.budget_gb): s for s in summarize_tpot(records)}
    results = evaluate_targets(records, REFERENCE_TARGETS)
    assert [r["target"] for r in results] == [
        "specter / lru <= 1/2",
        "specter / spec-lru <= 2/3",
        "specter / belady <= 1.5",
        "specter / hf <= 1/3",
    ]
    # These records hold no offload or llama.cpp: the product's cells are reported, not
    # measured.
    product = evaluate_targets(records)
    assert [(r["budget"], r["ratio"], r["met"]) for r in product[:4]] == [
        ("24 GB", None, None),
        ("24 GB", None, None),
        ("16 GB", None, None),
        ("unlimited", None, None),
    ]
    spec24 = by["specter24.0"]
    assert results[0]["ratio"] == pytest.approx(spec24.tpot_ms / by["lru24.0"].tpot_ms)
    assert results[0]["met"] == (results[0]["ratio"] <= 0.5)
    assert results[2]["ratio"] == pytest.approx(spec24.tpot_over_belady)
    # hf has no budget: the unlimited specter is compared with the one hf measurement.
    assert results[3]["ratio"] == pytest.approx(by["specterNone"].tpot_ms / by["hfNone"].tpot_ms)
    assert results[3]["acceptance_rate"] == pytest.approx(by["specterNone"].acceptance_rate)
    # A cell whose systems were not measured is reported, not dropped.
    missing = evaluate_targets(records, [Target("specter", "lru", 0.5, "<= 1/2", 99.0)])
    assert missing[0]["ratio"] is None
    assert missing[0]["met"] is None
    assert "not measured" in targets_table(records, [Target("specter", "lru", 0.5, "x", 99.0)])
    # A system missing at the target's budget is not replaced by its unlimited record.
    without_lru24 = [r for r in records if not (r["system"] == "lru" and r["budget_gb"] == 24.0)]
    assert any(r["system"] == "lru" and r["budget_gb"] is None for r in without_lru24)
    assert evaluate_targets(without_lru24, REFERENCE_TARGETS)[0]["ratio"] is None


def test_targets_met_and_not_met():
    def rec(system, budget, tpot, bound=None):
        return TpotRecord(
            system, "deepseek-v2-lite", budget, "humaneval", "p", 5, 8, tpot, None, None, None,
            tpot_over_belady=bound,
        ).as_dict()  # fmt: skip

    records = [
        rec("hf", None, 9.0),
        rec("specter", None, 2.0),  # 2/9 <= 1/3: met
        rec("lru", 24.0, 10.0),
        rec("spec-lru", 24.0, 6.0),
        rec("specter", 24.0, 4.5, bound=1.6),  # 0.45 met; 0.75 not met; 1.6 not met
    ]
    met = [r["met"] for r in evaluate_targets(records, REFERENCE_TARGETS)]
    assert met == [True, False, False, True]
    table = targets_table(records, REFERENCE_TARGETS)
    assert table.count("NOT met") == 2


def test_experiment_tables_hold_every_point():
    records = experiment_records(seed=13)
    ws = working_set_table(records)
    assert ws.count("\n") == 2 + 2 * 6
    pol = policy_table(records)
    assert pol.count("\n") == 2 + 2 * 2 * 2
    first = next(r for r in records if r["kind"] == "policy_hit_rate")
    assert f"{first['data']['policies']['lfu']['hit_rate']:.2f}" in pol
    assert "pinned" not in pol
    # A record with the pinned configuration and Belady at its slots gets both columns.
    first["data"]["policies"]["pinned"] = {"hit_rate": 0.8625, "loads": 4091}
    first["data"]["policies"]["belady_pinned_slots"] = {"hit_rate": 0.9573, "loads": 1280}
    first["data"]["pinned"] = {"experts_per_layer": 36, "slots_per_layer": 39}
    pol = policy_table(records)
    header = pol.splitlines()[0]
    assert "pinned hit rate" in header
    assert "belady at the pinned slots (warm) hit rate" in header
    row = next(line for line in pol.splitlines() if "0.86" in line)
    assert "0.96" in row
    assert "/ 4091 / 1280 |" in row
    assert "36 / 39" in row


def test_models_without_targets_get_the_same_ratios_for_information():
    records = tpot_records(seed=14, models=("deepseek-v2-lite", "qwen1.5-moe"))
    by = {(s.model, s.budget_gb, s.system): s for s in summarize_tpot(records)}
    results = evaluate_targets(records)
    qwen = [r for r in results if r["model"] == "qwen1.5-moe"]
    assert [(r["target"], r["budget"]) for r in qwen] == [
        ("specter / offload (no target)", "24 GB"),  # once: both map to the high budget
        ("specter / llama.cpp-cpu-moe-f16 (no target)", "24 GB"),
        ("specter / llama.cpp-gpu-f16 (no target)", "unlimited"),
        ("specter / hf (no target)", "unlimited"),
        ("specter / specter unlimited (no target)", "24 GB"),
    ]
    assert all(r["met"] is None for r in qwen)
    overhead = qwen[-1]
    assert overhead["ratio"] == pytest.approx(
        by[("qwen1.5-moe", 24.0, "specter")].tpot_ms / by[("qwen1.5-moe", None, "specter")].tpot_ms
    )
    lru = evaluate_targets(records, REFERENCE_TARGETS)
    qwen_lru = next(r for r in lru if r["model"] == "qwen1.5-moe" and "lru (" in r["target"])
    high = ("qwen1.5-moe", 24.0)
    assert qwen_lru["ratio"] == pytest.approx(
        by[(*high, "specter")].tpot_ms / by[(*high, "lru")].tpot_ms
    )
    table = targets_table(records)
    assert table.count("(no target)") == 5


def test_agreement_table_shows_greedy_and_sampled_acceptance():
    from specter_bench.bench_record import ExperimentRecord

    data = {
        "mean": 0.9, "exact_rate": 0.7, "per_layer": [0.8, 0.95, 0.99],
        "per_request": [0.85, 0.93], "greedy_agreement": 0.75,
        "sampled_acceptance": 0.614, "sampled_acceptance_t0.7": 0.686,
    }  # fmt: skip
    new = ExperimentRecord("routing_agreement", "proxy", None, data).as_dict()
    old = ExperimentRecord(
        "routing_agreement", "older", None, {"mean": 0.5, "per_layer": [0.5]}
    ).as_dict()  # written before sampled acceptance was measured
    lines = agreement_table([new, old]).splitlines()
    assert "sampled acceptance T=1" in lines[0]
    assert "sampled acceptance T=0.7" in lines[0]
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells == [
        "proxy",
        "0.90",
        "0.70",
        "0.80",
        "0.99",
        "0.85",
        "0.93",
        "2",
        "0.75",
        "0.61",
        "0.69",
    ]
    assert [c.strip() for c in lines[3].strip("|").split("|")][-3:] == ["-", "-", "-"]


def _lru_target(evaluated):
    """The ``specter / lru <= 1/2`` cell of :func:`evaluate_targets`' answer."""
    return next(t for t in evaluated if t["target"] == "specter / lru <= 1/2")


def _in_run(record, started, commit="abc1234", experiment=None):
    identity = {"git_commit": commit, "started_at": started}
    if experiment is not None:
        identity["experiment"] = experiment
    return {**record, "identity": identity}


def test_runs_stay_apart_and_targets_compare_within_one_run():
    def rec(system, budget, tpot):
        return TpotRecord(
            system, "deepseek-v2-lite", budget, "humaneval", "p", 5, 8, tpot, None, None, None
        ).as_dict()

    early, late = "2026-11-29T14:24:02+00:00", "2026-11-29T16:05:00+00:00"
    records = [
        _in_run(rec("specter", 24.0, 20.0), early),
        _in_run(rec("lru", 24.0, 50.0), early),
        _in_run(rec("specter", 24.0, 40.0), late, "def5678"),  # no lru in this run
    ]
    summaries = summarize_tpot(records)
    assert [(s.system, s.tpot_ms, s.run) for s in summaries] == [
        ("lru", 50.0, "2026-11-29T14:24 abc1234"),
        ("specter", 20.0, "2026-11-29T14:24 abc1234"),
        ("specter", 40.0, "2026-11-29T16:05 def5678"),
    ]
    first = _lru_target(evaluate_targets(records, REFERENCE_TARGETS))
    assert (first["ratio"], first["same_run"], first["run"]) == (0.4, True, summaries[0].run)
    table = tpot_table(records)
    assert table.splitlines()[0].endswith("| run |")
    assert "2026-11-29T16:05 def5678" in table
    # No run measured both sides: the latest of each, and the table says so.
    apart = [records[0], _in_run(rec("lru", 24.0, 50.0), late)]
    first = _lru_target(evaluate_targets(apart, REFERENCE_TARGETS))
    assert (first["ratio"], first["same_run"]) == (0.4, False)
    assert "met (two runs)" in targets_table(apart, REFERENCE_TARGETS)
    # One run: no run column.
    assert "| run |" not in tpot_table(records[:2])


def test_ratio_targets_prefer_the_latest_tpot_only_run():
    def rec(system, tpot):
        return TpotRecord(
            system, "deepseek-v2-lite", 24.0, "humaneval", "p", 5, 8, tpot, None, None, None
        ).as_dict()

    first, second, third = (f"2026-12-0{d}T01:00:00+00:00" for d in (1, 2, 3))
    tpot_run = [_in_run(rec("specter", 12.0), first, experiment="tpot")]
    tpot_run.append(_in_run(rec("lru", 18.0), first, experiment="tpot"))
    # A later routing run whose lru ran slow after its routing stage.
    routing_run = [_in_run(rec("specter", 12.5), second, "def5678", experiment="routing")]
    routing_run.append(_in_run(rec("lru", 27.0), second, "def5678", experiment="routing"))
    lru = [
        t
        for t in evaluate_targets(tpot_run + routing_run, REFERENCE_TARGETS)
        if t["target"].endswith("1/2")
    ]
    assert (lru[0]["tpot_ms"], lru[0]["versus_tpot_ms"], lru[0]["met"]) == (12.0, 18.0, False)
    assert lru[0]["run"] == "2026-12-01T01:00 abc1234"
    # The latest of several TPOT-only runs; with none, the latest run that measured both.
    later = [_in_run(rec(s, t), third, "aaa0000", experiment="tpot") for s, t in (
        ("specter", 9.0), ("lru", 20.0))]  # fmt: skip
    lru = [
        t
        for t in evaluate_targets(tpot_run + routing_run + later, REFERENCE_TARGETS)
        if "1/2" in t["target"]
    ]
    assert (lru[0]["ratio"], lru[0]["met"]) == (0.45, True)
    lru = [
        t for t in evaluate_targets(routing_run, REFERENCE_TARGETS) if t["target"].endswith("1/2")
    ]
    assert (lru[0]["tpot_ms"], lru[0]["versus_tpot_ms"]) == (12.5, 27.0)


def test_tpot_is_the_median_over_prompts():
    def rec(prompt, tpot):
        return TpotRecord(
            "lru", "deepseek-v2-lite", 24.0, "humaneval", prompt, 5, 8, tpot, None, None, None
        ).as_dict()

    (s,) = summarize_tpot([rec("a", 1.0), rec("b", 2.0), rec("c", 30.0)])
    assert s.tpot_ms == 2.0


def test_the_belady_target_takes_the_latest_run_that_measured_a_bound():
    def rec(tpot, bound):
        record = TpotRecord(
            "specter", "deepseek-v2-lite", 24.0, "humaneval", "p", 5, 8, tpot, None, None, None
        ).as_dict()
        record["belady_tpot_ms"] = bound
        record["tpot_over_belady"] = tpot / bound if bound else None
        return record

    early, late = "2026-11-29T14:24:02+00:00", "2026-11-29T16:05:00+00:00"
    records = [_in_run(rec(16.0, 2.0), early), _in_run(rec(13.0, None), late, "def5678")]
    (belady,) = [t for t in evaluate_targets(records, REFERENCE_TARGETS) if "belady" in t["target"]]
    assert (belady["tpot_ms"], belady["versus_tpot_ms"], belady["ratio"]) == (16.0, 2.0, 8.0)
    assert belady["met"] is False
    # Only unbounded runs: the latest, not measured.
    (belady,) = [
        t for t in evaluate_targets(records[1:], REFERENCE_TARGETS) if "belady" in t["target"]
    ]
    assert (belady["tpot_ms"], belady["ratio"]) == (13.0, None)


def test_targets_quote_the_last_runs_and_count_them_when_they_disagree():
    def rec(system, tpot, started):
        record = TpotRecord(
            system, "deepseek-v2-lite", 24.0, "humaneval", "p", 5, 8, tpot, None, None, None
        ).as_dict()
        return _in_run(record, started, started[11:16].replace(":", "") + "abc")

    # Seven runs of specter and lru at 24 GB; specter / lru = 0.7, 0.6, then 0.55, 0.45,
    # 0.52, 0.48, 0.40: the last five hold two misses.
    ratios = [0.7, 0.6, 0.55, 0.45, 0.52, 0.48, 0.40]
    records = []
    for hour, ratio in enumerate(ratios):
        started = f"2026-12-03T{10 + hour:02d}:00:00+00:00"
        records += [rec("lru", 20.0, started), rec("specter", 20.0 * ratio, started)]
    first = _lru_target(evaluate_targets(records, REFERENCE_TARGETS))
    assert first["ratio"] == pytest.approx(0.40)  # the latest run decides `met`
    assert first["met"] is True
    assert first["recent"] == pytest.approx(ratios[-5:])  # oldest first
    row = next(
        line for line in targets_table(records, REFERENCE_TARGETS).splitlines() if "<= 1/2" in line
    )
    assert "met in 3 of the last 5 runs" in row
    assert "0.55, 0.45, 0.52, 0.48, 0.40" in row
    # Runs that agree keep the plain status.
    agreeing = records[-4:]  # the last two runs: 0.48 and 0.40, both met
    row = next(
        line for line in targets_table(agreeing, REFERENCE_TARGETS).splitlines() if "<= 1/2" in line
    )
    assert "| met |" in row
    assert "0.48, 0.40" in row


def test_experiment_tables_name_the_run_of_each_row_when_runs_repeat_them():
    # The same experiment from two runs: every experiment table says which row came from
    # which run; from one run, no run column.
    from specter_bench.tables import (
        depth_sweep_table,
        hot_experts_table,
        hot_sweep_table,
        memory_table,
    )

    early, late = "2026-12-03T10:00:00+00:00", "2026-12-04T06:00:00+00:00"
    base = experiment_records(seed=21)
    extra = [
        {"kind": "hot_experts", "model": "deepseek-v2-lite", "budget_gb": 24.0,
         "data": {"per_layer": 36, "slots_per_layer": 39, "window": 5, "loads": {"0": 9, "36": 5}}},
        {"kind": "hot_sweep", "model": "deepseek-v2-lite", "budget_gb": 24.0,
         "data": {"chosen": 36, "points": [{"hot_experts_per_layer": 36, "slots_per_layer": 39,
                                            "tpot_ms": 9.1}]}},
        {"kind": "memory", "model": "deepseek-v2-lite", "budget_gb": 24.0,
         "data": {"with_draft": False, "slots_per_layer": 46, "measured_peak_gb": 24.8}},
        {"kind": "depth_sweep", "model": "deepseek-v2-lite", "budget_gb": 24.0,
         "data": {"best_depth": 2, "points": [{"depth": 2, "tpot_ms": 9.0}]}},
        {"kind": "routing_agreement", "model": "deepseek-v2-lite", "budget_gb": 24.0,
         "data": {"mean": 0.9, "per_layer": [0.8, 1.0], "per_request": [0.9]}},
    ]  # fmt: skip
    one_run = [_in_run(r, early) for r in [*base, *extra]]
    two_runs = [*one_run, *(_in_run(r, late, "bfb22bc") for r in [*base, *extra])]
    tables = (policy_table, working_set_table, agreement_table, hot_experts_table,
              hot_sweep_table, memory_table, depth_sweep_table)  # fmt: skip
    for table in tables:
        alone = table(one_run)
        assert len(alone.splitlines()) > 2, table.__name__  # rows to label
        assert "| run |" not in alone, table.__name__
        both = table(two_runs)
        lines = both.splitlines()
        assert lines[0].endswith("| run |"), table.__name__
        assert len(lines) == 2 + 2 * (len(alone.splitlines()) - 2), table.__name__
        assert sum("2026-12-04T06:00 bfb22bc" in line for line in lines[2:]) * 2 == len(lines) - 2
        assert sum("2026-12-03T10:00 abc1234" in line for line in lines[2:]) * 2 == len(lines) - 2


def test_memory_and_hot_set_tables_name_a_pruned_draft():
    from specter_bench.tables import hot_experts_table, memory_table

    def memory(**data):
        return {"kind": "memory", "model": "deepseek-v2-lite", "budget_gb": 24.0,
                "data": {"slots_per_layer": 45, **data}}  # fmt: skip

    drafts = [
        memory(with_draft=True, hot_experts_per_layer=40, pruned_experts_per_layer=21),
        memory(with_draft=True, hot_experts_per_layer=36),  # a record from before pruning
        memory(with_draft=False),
    ]
    rows = memory_table(drafts).splitlines()[2:]
    assert [row.split("|")[3].strip() for row in rows] == [
        "int4 + 40 hot, 21 pruned",
        "int4 + 36 hot",
        "none",
    ]
    hot = {"kind": "hot_experts", "model": "deepseek-v2-lite", "budget_gb": 24.0,
           "data": {"per_layer": 40, "pruned_per_layer": 21, "slots_per_layer": 45,
                    "window": 5, "loads": {"40": 7}}}  # fmt: skip
    header, _, row = hot_experts_table([hot]).splitlines()
    cells = dict(zip(header.split("|"), row.split("|"), strict=True))
    assert cells[" pruned/layer "].strip() == "21"
    assert cells[" slots/layer "].strip() == "45"


def test_repeated_runs_give_a_median_a_range_and_a_verdict_at_the_worst_run():
    def rec(system, budget, tpot, run_index, prompt="p"):
        record = TpotRecord(
            system, "deepseek-v2-lite", budget, "humaneval", prompt, 5, 8, tpot, None, None,
            None, run_index=run_index,
        ).as_dict()  # fmt: skip
        return _in_run(record, "2026-12-05T10:00:00+00:00", experiment="tpot")

    # Three runs of specter and offload at 24 GB: 0.60, 0.65 and 0.75 of offload.
    records = []
    for run_index, (mine, theirs) in enumerate(((6.0, 10.0), (6.5, 10.0), (7.5, 10.0))):
        records += [rec("specter", 24.0, mine, run_index), rec("offload", 24.0, theirs, run_index)]
        records.append(rec("specter", 24.0, mine + 100.0, run_index, prompt="q"))  # prompts' median
        records.append(rec("offload", 24.0, theirs + 100.0, run_index, prompt="q"))
    specter = next(s for s in summarize_tpot(records) if s.system == "specter")
    assert specter.tpot_by_run == {0: 56.0, 1: 56.5, 2: 57.5}
    assert specter.tpot_ms == 56.5
    assert (specter.runs, specter.tpot_min_ms, specter.tpot_max_ms) == (3, 56.0, 57.5)
    assert specter.tpot_range == "56.00-57.50 (3 runs)"
    assert "56.00-57.50 (3 runs)" in tpot_table(records)
    cell = next(t for t in evaluate_targets(records) if t["target"] == "specter / offload <= 0.7")
    assert cell["per_run"] == pytest.approx({0: 56 / 60, 1: 56.5 / 60, 2: 57.5 / 60})
    assert cell["met"] is False
    # One prompt: 0.60, 0.65 and 0.75; the worst run decides.
    only_p = [r for r in records if r["prompt_id"] == "p"]
    loose = Target("specter", "offload", 0.8, "<= 0.8", 24.0, "deepseek-v2-lite")
    assert evaluate_targets(only_p, [loose])[0]["met"] is True
    cell = next(t for t in evaluate_targets(only_p) if t["target"] == "specter / offload <= 0.7")
    assert cell["ratio"] == pytest.approx(0.65)  # the median run
    assert cell["met"] is False  # the worst, 0.75, is not within 0.7
    row = next(line for line in targets_table(only_p).splitlines() if "offload <= 0.7" in line)
    assert "0.60, 0.65, 0.75 (worst 0.75)" in row
    assert "NOT met at the worst of 3 runs" in row


def test_a_fallback_and_the_textbook_lru_are_labelled():
    def rec(system, speculation=None):
        record = TpotRecord(
            system, "deepseek-v2-lite", 16.0, "humaneval", "p", 5, 8, 9.0, None, None, None
        ).as_dict()
        if speculation is not None:
            record["extra"] = {"settings": {"speculation": speculation}}
        return record

    said = "off (depth auto chose 0: plain decoding 90.0 tokens/s, ...)"
    table = tpot_table([rec("specter", said), rec("lru", "off"), rec("offload", "off")])
    header, _, *rows = table.splitlines()
    assert header.endswith("| speculation |")
    specter = next(row for row in rows if "| specter |" in row)
    assert specter.endswith(f"| {said} |")
    assert any("| lru (textbook reference, host-bound) |" in row for row in rows)
    assert "speculation" not in tpot_table([rec("lru", "off")])  # nothing chose to fall back


def test_the_product_targets_compare_with_llama_cpp_and_specter_all_resident():
    def rec(system, budget, tpot):
        return TpotRecord(
            system, "deepseek-v2-lite", budget, "humaneval", "p", 5, 8, tpot, None, None, None
        ).as_dict()

    ours = [rec("specter", 24.0, 6.0), rec("offload", 24.0, 10.0), rec("specter", None, 2.5)]
    ours = [_in_run(r, "2026-12-07T10:00:00+00:00", experiment="tpot") for r in ours]
    llama = [rec("llama.cpp-cpu-moe-f16", 24.0, 15.0), rec("llama.cpp-gpu-f16", None, 4.0)]
    llama = [_in_run(r, "2026-12-07T11:00:00+00:00", "fff0000") for r in llama]
    cells = {t["target"]: t for t in evaluate_targets(ours + llama)}
    assert cells["specter / offload <= 0.7"]["ratio"] == pytest.approx(0.6)
    # llama.cpp runs in its own process: the ratio pairs the two runs and says so.
    cpu_moe = cells["specter / llama.cpp-cpu-moe-f16 <= 0.5"]
    assert (cpu_moe["ratio"], cpu_moe["met"], cpu_moe["same_run"]) == (0.4, True, False)
    gpu = cells["specter / llama.cpp-gpu-f16 <= 0.8"]
    assert (gpu["budget"], gpu["ratio"], gpu["met"]) == ("unlimited", 0.625, True)
    # The offloading overhead: specter at 24 GB over its own all-resident time.
    overhead = cells["specter / specter unlimited <= 2"]
    assert (overhead["budget"], overhead["ratio"], overhead["met"]) == ("24 GB", 2.4, False)
    assert overhead["versus_tpot_ms"] == 2.5
    assert not any("belady" in name or "lru" in name for name in cells)


def test_a_run_of_repeated_passes_outweighs_a_later_single_pass():
    def rec(system, tpot, run_index, started):
        record = TpotRecord(
            system, "deepseek-v2-lite", 24.0, "humaneval", "p", 5, 8, tpot, None, None,
            None, run_index=run_index,
        ).as_dict()  # fmt: skip
        return _in_run(record, started, started[11:16].replace(":", "") + "abc", "tpot")

    early, late = "2026-12-07T10:00:00+00:00", "2026-12-07T11:00:00+00:00"
    pairs = (("specter", 6.0), ("offload", 10.0))
    records = [rec(s, t, i, early) for i in range(3) for s, t in pairs]
    records += [rec("specter", 9.0, 0, late), rec("offload", 10.0, 0, late)]  # one later pass
    cell = next(t for t in evaluate_targets(records) if t["target"] == "specter / offload <= 0.7")
    assert cell["ratio"] == pytest.approx(0.6)
    assert cell["run"].startswith("2026-12-07T10:00")
    assert cell["met"] is True


def test_each_target_holds_under_random_and_under_replayed_routing():
    def rec(system, budget, tpot, routing):
        record = TpotRecord(
            system, "deepseek-v2-lite", budget, "humaneval", "p", 5, 8, tpot, None, None, None
        ).as_dict()
        record = _in_run(record, "2026-12-08T10:00:00+00:00", experiment="tpot")
        record["identity"]["routing"] = routing
        return record

    records = [
        rec("specter", 24.0, 6.0, "random"), rec("offload", 24.0, 10.0, "random"),
        rec("specter", 24.0, 9.0, "replay:dsv2.pt"), rec("offload", 24.0, 10.0, "replay:dsv2.pt"),
    ]  # fmt: skip
    cells = [t for t in evaluate_targets(records) if t["target"] == "specter / offload <= 0.7"]
    assert [(c["model"], c["ratio"], c["met"]) for c in cells] == [
        ("deepseek-v2-lite", pytest.approx(0.6), True),
        ("deepseek-v2-lite (replay:dsv2.pt)", pytest.approx(0.9), False),
    ]
    assert "(no target)" not in targets_table(records)
