"""The curated results page (``specter report --index``): every table row names its file.

The index is a markdown table (``benchmarks/results/README.md``) with one row per kept
result file and the columns ``file``, ``backs`` (the figure it backs), ``command``,
``commit`` and ``GPU``. The page lists every indexed file with its command, then the
report's tables and plots over the records of the indexed ``bench-*.jsonl`` files (what
``specter bench`` writes) whose ``backs`` names the page (``results.md``); each row of a
table carries a ``source`` column naming its file. A record without a recorded command
takes the index's.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specter_bench.bench_record import read_records
from specter_bench.report import report_sections
from specter_bench.table_format import markdown_table

__all__ = [
    "INDEX_COLUMNS",
    "CuratedResult",
    "build_results_page",
    "read_curated_records",
    "read_index",
    "write_results_page",
]

INDEX_COLUMNS = ("file", "backs", "command", "commit", "gpu")
"""The index table's columns (matched case-insensitively, in any order)."""

_CELL_SPLIT = re.compile(r"(?<!\\)\|")


@dataclass(frozen=True)
class CuratedResult:
    """One row of the index: a kept result file and where its figures are quoted."""

    file: str
    """The file's path relative to the index's folder."""
    backs: str
    """The figures it backs (a page and what it shows)."""
    command: str
    """The command that wrote it."""
    commit: str
    """The commit it was measured at."""
    gpu: str
    """The GPU it was measured on."""

    def tabulated_on(self, page: str) -> bool:
        """Whether the page named ``page`` (``results.md``) tabulates its records: a file that
        ``specter bench`` wrote (``bench-*.jsonl``) whose ``backs`` names the page."""
        name = Path(self.file).name
        return name.startswith("bench-") and name.endswith(".jsonl") and page in self.backs


def _cells(line: str) -> list[str]:
    inner = line.strip().removeprefix("|").removesuffix("|")
    return [_unquote(c.strip().replace("\\|", "|")) for c in _CELL_SPLIT.split(inner)]


def _unquote(cell: str) -> str:
    """A cell that is one code span, without its backticks; any other cell as written."""
    if len(cell) >= 2 and cell[0] == cell[-1] == "`" and "`" not in cell[1:-1]:
        return cell[1:-1]
    return cell


def read_index(index: str | Path) -> list[CuratedResult]:
    """The rows of the index's first table whose header holds :data:`INDEX_COLUMNS`.

    Raises:
        FileNotFoundError: the index does not exist.
        ValueError: no such table, a row with the wrong number of cells, an empty file
            name, or a file listed twice (the message names the index and the row).
    """
    index = Path(index)
    if not index.is_file():
        raise FileNotFoundError(
            f"{index} does not exist; expected the results index (a markdown table with the "
            f"columns {', '.join(INDEX_COLUMNS)})."
        )
    lines = index.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines):
        if not line.lstrip().startswith("|"):
            continue
        header = [c.lower() for c in _cells(line)]
        if not set(INDEX_COLUMNS) <= set(header):
            continue
        columns = {name: header.index(name) for name in INDEX_COLUMNS}
        entries: list[CuratedResult] = []
        for lineno, row in enumerate(lines[i + 2 :], start=i + 3):
            if not row.lstrip().startswith("|"):
                break
            cells = _cells(row)
            if len(cells) != len(header):
                raise ValueError(
                    f"{index} line {lineno}: {len(cells)} cells for the {len(header)} columns "
                    f"{header}; escape a '|' inside a cell as '\\|'."
                )
            entry = CuratedResult(**{name: cells[col] for name, col in columns.items()})
            if not entry.file:
                raise ValueError(f"{index} line {lineno}: the row names no file.")
            if any(e.file == entry.file for e in entries):
                raise ValueError(f"{index} line {lineno}: {entry.file} is listed twice.")
            entries.append(entry)
        return entries
    raise ValueError(
        f"{index} holds no table with the columns {', '.join(INDEX_COLUMNS)}; expected one row "
        "per result file."
    )


def read_curated_records(
    index: str | Path, entries: Sequence[CuratedResult], page: str = "results.md"
) -> list[dict[str, Any]]:
    """The records of the entries the page tabulates (:meth:`CuratedResult.tabulated_on`),
    each with ``source`` set to its file and, where the record holds no command, the index's
    command in its identity.

    Raises:
        FileNotFoundError: an indexed file is missing (any entry, tabulated or not).
        ValueError: from reading the records.
    """
    folder = Path(index).parent
    records: list[dict[str, Any]] = []
    for entry in entries:
        path = folder / entry.file
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} is listed in {index} but does not exist; restore it (it is in git "
                "history) or remove its row from the index."
            )
        if not entry.tabulated_on(page):
            continue
        for record in read_records(path):
            identity = dict(record.get("identity") or {})
            if not identity.get("command") and entry.command:
                identity["command"] = entry.command
            records.append({**record, "identity": identity, "source": entry.file})
    return records


def _recorded_command(entry: CuratedResult, records: Sequence[dict[str, Any]]) -> str:
    for r in records:
        if r.get("source") == entry.file:
            command = (r.get("identity") or {}).get("command")
            if command:
                return str(command)
    return entry.command


def build_results_page(
    index: str | Path,
    entries: Sequence[CuratedResult],
    records: Sequence[dict[str, Any]],
    plots_dir: Path,
    *,
    relative_to: Path,
    regenerate: str,
) -> str:
    """The page's markdown; writes its plots into ``plots_dir``.

    Args:
        index: the index file (linked from the page).
        entries: its rows.
        records: :func:`read_curated_records` of them.
        plots_dir: where the PNG files go.
        relative_to: the page's folder (links are relative to it).
        regenerate: the command that regenerates the page (quoted at its top).

    Raises:
        ValueError: no tabulated records.
    """
    if not records:
        raise ValueError(
            f"{index} lists no bench-*.jsonl file with records whose `backs` names this page; "
            "the page tabulates the records `specter bench` writes."
        )

    def link(path: Path) -> str:
        return Path(os.path.relpath(path, relative_to)).as_posix()

    folder = Path(index).parent
    shown = {r.get("source") for r in records}
    rows = [
        [
            f"[`{e.file}`]({link(folder / e.file)})",
            e.backs,
            f"`{_recorded_command(e, records)}`",
            f"`{e.commit}`" if e.commit else "-",
            e.gpu or "-",
        ]
        for e in entries
        if e.file in shown
    ]
    parts = [
        "# Results",
        "",
        f"<!-- generated by `{regenerate}`; edits are lost -->",
        "",
        "Every figure below comes from a result file listed under Sources with the command "
        "that wrote it, the commit and the GPU; each table row names its file in the "
        "`source` column. The index of every kept result file, those that back other "
        f"pages included, is [`{link(Path(index))}`]({link(Path(index))}). Weights are "
        "seeded random unless a file says otherwise, so acceptance and routing are those of "
        "random weights ([benchmarking](benchmarking.md) says what that means). "
        f"Regenerate the page with `{regenerate}`.",
        "",
        "## Sources",
        "",
        markdown_table(["file", "backs", "command", "commit", "GPU"], rows),
    ]
    parts += report_sections(records, plots_dir, relative_to=relative_to, level=2)
    return "\n".join(parts).rstrip() + "\n"


def write_results_page(
    index: str | Path,
    markdown: str | Path,
    plots_dir: str | Path | None = None,
) -> Path:
    """Read the index and its files, write the plots and the whole page ``markdown``.

    Args:
        index: the results index (``benchmarks/results/README.md``).
        markdown: the page to write (replaced).
        plots_dir: where plots go (default: ``<markdown folder>/img``).

    Returns:
        The markdown path.

    Raises:
        FileNotFoundError: the index or an indexed file is missing.
        ValueError: a malformed index or result file.
    """
    index, markdown = Path(index), Path(markdown)
    entries = read_index(index)
    records = read_curated_records(index, entries, markdown.name)
    plots = Path(plots_dir) if plots_dir is not None else markdown.parent / "img"
    regenerate = f"specter report --index {index.as_posix()} --markdown {markdown.as_posix()}"
    if plots_dir is not None:
        regenerate += f" --plots-dir {plots.as_posix()}"
    page = build_results_page(
        index, entries, records, plots, relative_to=markdown.parent, regenerate=regenerate
    )
    markdown.parent.mkdir(parents=True, exist_ok=True)
    markdown.write_text(page, encoding="utf-8")
    return markdown
