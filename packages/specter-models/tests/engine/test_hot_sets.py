"""Reading a pinned hot set from a bench results file or a JSON file."""

import json

import pytest

from specter_models.engine.hot_sets import read_hot_set


def _record(budget, hot):
    return {"kind": "hot_experts", "budget_gb": budget, "data": {"hot_experts": hot}}


def test_a_bench_results_file_gives_the_hot_set_at_the_asked_budget(tmp_path):
    path = tmp_path / "bench.jsonl"
    lines = [{"kind": "memory", "data": {}}, _record(16.0, [[1], [2]]), _record(24.0, [[3], [4]])]
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert read_hot_set(path, 24.0)[0] == [[3], [4]]
    assert read_hot_set(path, 16.0)[0] == [[1], [2]]
    with pytest.raises(ValueError, match="several budgets"):
        read_hot_set(path)
    with pytest.raises(ValueError, match="no hot_experts record at 20 GB"):
        read_hot_set(path, 20.0)
    single = tmp_path / "single.jsonl"
    single.write_text(json.dumps(_record(24.0, [[0, 5], [6, 7]])) + "\n")
    assert read_hot_set(single)[0] == [[0, 5], [6, 7]]


def test_json_objects_and_lists_are_read(tmp_path):
    path = tmp_path / "hot.json"
    path.write_text(json.dumps({"hot_experts": [[0, 1], [2, 3]]}, indent=1))
    assert read_hot_set(path)[0] == [[0, 1], [2, 3]]
    path.write_text(json.dumps([[4], [5]]))
    assert read_hot_set(path)[0] == [[4], [5]]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"hot_experts": [[0, -1]]}', "one list of expert ids"),
        ('{"hot_experts": []}', "non-empty list"),
        ('[["a"]]', "ints >= 0"),
        ('{"kind": "tpot"}\nnot json\n', "line 2 is not JSON"),
        ('{"kind": "tpot"}\n', "no hot_experts record"),
    ],
)
def test_malformed_files_are_reported(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        read_hot_set(path)
    with pytest.raises(FileNotFoundError, match="no such file"):
        read_hot_set(tmp_path / "missing.json")


def test_plain_decoding_wins_only_where_its_in_place_reads_cost_less_link_time():
    from specter_models import HotExpertChoice, PlainReplay
    from specter_models.engine.hot_sets import IN_PLACE_READ_COST, PromptChoice

    hot = HotExpertChoice(4, [[0, 1, 2, 3]], 6, loads={4: 150})
    # 100 plain loads cost 165 of the draft's at 1.65: more than its 150, so speculate
    assert IN_PLACE_READ_COST == 1.65  # the rate ratio the comments below assume
    speculative = PromptChoice(hot, PlainReplay(8, 100))
    assert not speculative.decode_plainly
    assert speculative.as_dict()["decoded"] == "speculative"
    assert PromptChoice(hot, PlainReplay(8, 90)).decode_plainly  # 148.5 < 150
    assert not PromptChoice(hot, None).decode_plainly  # nothing compared


def test_a_hot_set_file_gives_its_pruned_experts_beside_the_hot_set(tmp_path):
    path = tmp_path / "run.jsonl"
    record = _record(24.0, [[0, 1], [2, 3]])
    record["data"]["pruned_experts"] = [[6, 7], [5, 7]]
    path.write_text(json.dumps(record) + "\n")
    assert read_hot_set(path, 24.0) == ([[0, 1], [2, 3]], [[6, 7], [5, 7]])
    record["data"]["pruned_experts"] = [[], []]  # a record of a run that pruned nothing
    path.write_text(json.dumps(record) + "\n")
    assert read_hot_set(path, 24.0) == ([[0, 1], [2, 3]], None)
    bare = tmp_path / "hot.json"
    bare.write_text(json.dumps([[0, 1]]))
    assert read_hot_set(bare) == ([[0, 1]], None)
    bare.write_text(json.dumps({"hot_experts": [[0, 1]], "pruned_experts": [[-1]]}))
    with pytest.raises(ValueError, match="ints >= 0"):
        read_hot_set(bare)
