"""The curated results page: the index is read as written, every table row names its file,
the index supplies a command the records lack, and a bad index is a clear error."""

import json

import pytest

from bench_fixtures import experiment_records, tpot_records
from specter_bench.cli import main
from specter_bench.results_page import read_index, write_results_page

HEADER = "| file | backs | command | commit | GPU |\n|---|---|---|---|---|\n"


def _write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


def _tree(tmp_path):
    """Two bench files on the page, one bench file for another page, one log."""
    results = tmp_path / "benchmarks" / "results"
    results.mkdir(parents=True)
    dsv2 = tpot_records(seed=1, models=("deepseek-v2-lite",))
    qwen = tpot_records(seed=2, models=("qwen1.5-moe",))
    for r in qwen:  # this file records its command; the other does not
        r["identity"] = {"command": "specter bench --model qwen1.5-moe", "git_commit": "abc1234"}
    _write_jsonl(results / "bench-dsv2.jsonl", dsv2 + experiment_records(seed=3)[:1])
    _write_jsonl(results / "bench-qwen.jsonl", qwen)
    _write_jsonl(results / "bench-old.jsonl", tpot_records(seed=4, models=("phi-3.5-moe",)))
    (results / "probe.txt").write_text("a probe's output\n", encoding="utf-8")
    index = results / "README.md"
    index.write_text(
        "# Results\n\nSome text.\n\n"
        + HEADER
        + "| `bench-dsv2.jsonl` | docs/results.md: `specter` against `lru` | "
        "`specter bench --model deepseek-v2-lite` | `1234567` | one NVIDIA H200 |\n"
        "| `bench-qwen.jsonl` | docs/results.md: Qwen | `from the index` | `abc1234` | H200 |\n"
        "| `bench-old.jsonl` | docs/decisions.md: A/B | `specter bench --model phi` | - | H200 |\n"
        "| `probe.txt` | docs/decisions.md: a probe | `python3 probe.py \\| tee x` | - | H200 |\n"
        "\nText after the table.\n",
        encoding="utf-8",
    )
    return tmp_path, index


def test_the_index_is_read_as_written(tmp_path):
    _, index = _tree(tmp_path)
    entries = read_index(index)
    assert [e.file for e in entries] == [
        "bench-dsv2.jsonl",
        "bench-qwen.jsonl",
        "bench-old.jsonl",
        "probe.txt",
    ]
    assert entries[0].backs == "docs/results.md: `specter` against `lru`"  # inner code kept
    assert entries[0].command == "specter bench --model deepseek-v2-lite"
    assert entries[0].commit == "1234567"
    assert entries[0].gpu == "one NVIDIA H200"
    assert entries[3].command == "python3 probe.py | tee x"  # an escaped pipe stays in its cell
    assert [e.tabulated_on("results.md") for e in entries] == [True, True, False, False]


def test_every_table_row_names_its_file_and_the_sources_name_the_command(tmp_path):
    root, index = _tree(tmp_path)
    page_path = write_results_page(index, root / "docs" / "results.md")
    page = page_path.read_text(encoding="utf-8")
    tpot = page.split("## TPOT per system", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in tpot.splitlines() if line.startswith("| ") and "---" not in line]
    header, body = rows[0], rows[1:]
    assert header.rstrip(" |").endswith("source")
    assert body
    assert all(
        row.endswith("| bench-dsv2.jsonl |") or row.endswith("| bench-qwen.jsonl |") for row in body
    )
    assert any("qwen1.5-moe" in row and row.endswith("| bench-qwen.jsonl |") for row in body)
    assert "phi-3.5-moe" not in page  # bench-old.jsonl backs another page
    targets = page.split("## Targets", 1)[1].split("\n## ", 1)[0]
    target_rows = [r for r in targets.splitlines() if r.startswith("| deepseek-v2-lite | 24 GB")]
    assert target_rows
    assert all(r.endswith("| bench-dsv2.jsonl |") for r in target_rows)
    sources = page.split("## Sources", 1)[1].split("\n## ", 1)[0]
    dsv2_row = next(line for line in sources.splitlines() if "bench-dsv2.jsonl" in line)
    qwen_row = next(line for line in sources.splitlines() if "bench-qwen.jsonl" in line)
    # The records of bench-dsv2.jsonl hold no command: the index gives it.
    assert "`specter bench --model deepseek-v2-lite`" in dsv2_row
    # bench-qwen.jsonl records its own, which wins over the index's.
    assert "`specter bench --model qwen1.5-moe`" in qwen_row
    assert "from the index" not in page
    assert "(../benchmarks/results/bench-dsv2.jsonl)" in dsv2_row  # a link relative to docs/
    assert "specter report --index" in page  # the page says how to regenerate it
    assert (root / "docs" / "img" / "tpot_per_system.png").is_file()


def test_a_missing_file_is_named_with_its_index(tmp_path):
    root, index = _tree(tmp_path)
    (index.parent / "probe.txt").unlink()  # not tabulated, still checked
    with pytest.raises(FileNotFoundError, match=r"probe\.txt is listed in .*README\.md"):
        write_results_page(index, root / "docs" / "results.md")


def test_an_index_without_the_table_or_with_a_bad_row_is_refused(tmp_path):
    index = tmp_path / "README.md"
    index.write_text("| file | command |\n|---|---|\n| a | b |\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no table with the columns file, backs"):
        read_index(index)
    index.write_text(HEADER + "| `a.jsonl` | x | y |\n", encoding="utf-8")
    with pytest.raises(ValueError, match="line 3: 3 cells for the 5 columns"):
        read_index(index)
    index.write_text(HEADER + "| a | x | y | - | - |\n| a | z | y | - | - |\n", encoding="utf-8")
    with pytest.raises(ValueError, match="a is listed twice"):
        read_index(index)
    with pytest.raises(FileNotFoundError, match="expected the results index"):
        read_index(tmp_path / "absent.md")


def test_an_index_with_nothing_for_the_page_is_refused(tmp_path):
    root, index = _tree(tmp_path)
    text = index.read_text(encoding="utf-8").replace("docs/results.md", "docs/other.md")
    index.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=r"no bench-\*\.jsonl file with records"):
        write_results_page(index, root / "docs" / "results.md")


def test_the_report_command_takes_an_index_or_files_not_both(tmp_path, capsys):
    root, index = _tree(tmp_path)
    out = root / "docs" / "results.md"
    assert main(["report", "--index", str(index), "--markdown", str(out)]) == 0
    assert out.read_text(encoding="utf-8").startswith("# Results\n")
    assert main(["report"]) == 2
    assert "give either --index" in capsys.readouterr().err
    files = [str(index.parent / "bench-dsv2.jsonl")]
    assert main(["report", *files, "--index", str(index), "--markdown", str(out)]) == 2
