"""Repository checks that ruff does not make; run by ``nox -s lint`` (``check-repo``).

Usage::

    python .ci/check_repo.py [--root PATH] [--max-lines 600]

It reads every file git tracks (binary files, ``uv.lock`` and the data files under
``benchmarks/results/`` left out) and prints one ``path:line: rule: message`` line per
finding, every finding of every file, then exits 1 if there was any. The rules:

``history``
    Prose that narrates how the repository was developed instead of describing the
    product: a session named by an ordinal or relative to another (an ordinal or "this",
    "next", "previous", "earlier", "last" before the word session), a numbered session,
    an issue number (the word issue followed by a number), a numbered work round, or the
    name the team gives its GPU host (a reader has no such machine: say "a CUDA machine"
    or "a machine without internet access"). A session of nox, an HTTP session and
    GitHub issues without a number are fine.
``link``
    A link in README.md, a README of a package or any other README, or a page under
    docs/ whose target is a relative path leaving the repository or naming a file git
    does not track. Web links (``https:``, ``mailto:``) and in-page anchors are not
    followed; code blocks and inline code are not links.
``module-length``
    A module under ``packages/*/src`` longer than the limit (600 lines by default).
"""

from __future__ import annotations

import argparse
import posixpath
import re
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote

MAX_MODULE_LINES = 600

_UNITS = "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth"
_TEENS = (
    "tenth|eleventh|twelfth|thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|"
    "eighteenth|nineteenth"
)
_TENS = "twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety"
_TENTHS = "twentieth|thirtieth|fortieth|fiftieth|sixtieth|seventieth|eightieth|ninetieth"
_ORDINAL = (
    rf"(?:(?:{_TENS})[- ]?(?:{_UNITS})|{_TENTHS}|hundredth|{_TEENS}|{_UNITS}"
    r"|\d+(?:st|nd|rd|th))"
)
_NUMBER = r"#?\d+(?![.\d-])"

HISTORY_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), what)
    for pattern, what in (
        (rf"\b{_ORDINAL}\s+sessions?\b", "an ordinal session"),
        (
            r"\b(?:this|next|previous|earlier|last|prior|later)\s+sessions?\b",
            "a session relative to another",
        ),
        (rf"\bsessions?\s+{_NUMBER}", "a numbered session"),
        (rf"\bissues?\s+{_NUMBER}", "an issue number"),
        (rf"\bissue\s+(?:number|no\.?)\s*{_NUMBER}", "an issue number"),
        (rf"\b(?:review\s+|work\s+)?rounds?\s+{_NUMBER}", "a numbered work round"),
        (rf"\b{_ORDINAL}\s+(?:review\s+|work\s+)?round\b(?!-)", "a numbered work round"),
        (r"\bthe\s+GPU\s+machine\b", "the team's machine"),
    )
)

# Markdown links: [text](target "title"), ![alt](target), [id]: target, <a href="target">,
# <img src="target">.
_INLINE_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'(][^)]*)?\)")
_REFERENCE_LINK = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
_HTML_LINK = re.compile(r"<(?:a|img)\b[^>]*?\b(?:href|src)\s*=\s*[\"']([^\"']+)[\"']", re.I)
_FENCE = re.compile(r"^\s{0,3}(```|~~~)")
_INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
_WEB = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # https:, mailto:, data: ...

_DATA_UNDER = "benchmarks/results/"
_SKIPPED = frozenset({"uv.lock"})


@dataclass(frozen=True, order=True)
class Finding:
    """One rule broken at ``path:line`` (``path`` relative to the repository root)."""

    path: str
    line: int
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.rule}: {self.message}"


def tracked_files(root: Path) -> list[str]:
    """Paths git tracks under ``root``, relative to it, with ``/`` separators."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z"], cwd=root, capture_output=True, check=True
        ).stdout
    except (OSError, subprocess.CalledProcessError) as error:
        raise SystemExit(
            f"check_repo: cannot list the files git tracks under {root} ({error}); run it "
            "inside a git checkout of the repository."
        ) from error
    return sorted(p for p in out.decode().split("\0") if p)


def is_checked(path: str) -> bool:
    """Whether ``path`` is read at all (uv.lock and result data files are not)."""
    if path in _SKIPPED:
        return False
    return not (path.startswith(_DATA_UNDER) and not path.endswith(".md"))


def read_text(file: Path) -> str | None:
    """``file``'s text, None for a binary file (a NUL byte, or not UTF-8) or a missing one."""
    try:
        data = file.read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        return None
    if b"\0" in data[:8192]:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def check_history(path: str, text: str) -> list[Finding]:
    """``history`` findings of one file's text."""
    findings = []
    for number, line in enumerate(text.splitlines(), start=1):
        for pattern, what in HISTORY_PATTERNS:
            for match in pattern.finditer(line):
                findings.append(
                    Finding(
                        path,
                        number,
                        "history",
                        f"{what} ({match.group(0)!r}): describe the product as it is "
                        "(a figure by what was measured, on which GPU, at which commit); "
                        "history lives in git",
                    )
                )
    return findings


def links_file(path: str) -> bool:
    """Whether ``path``'s links are checked: every README.md, and Markdown under docs/."""
    return posixpath.basename(path) == "README.md" or (
        path.startswith("docs/") and path.endswith(".md")
    )


def link_targets(text: str) -> Iterable[tuple[int, str]]:
    """``(line, target)`` of every link in Markdown ``text``, code left out."""
    in_fence: str | None = None
    for number, line in enumerate(text.splitlines(), start=1):
        fence = _FENCE.match(line)
        if fence:
            if in_fence is None:
                in_fence = fence.group(1)
            elif fence.group(1) == in_fence:
                in_fence = None
            continue
        if in_fence is not None:
            continue
        prose = _INLINE_CODE.sub("", line)
        for pattern in (_INLINE_LINK, _REFERENCE_LINK, _HTML_LINK):
            for match in pattern.finditer(prose):
                yield number, match.group(1)


def check_links(path: str, text: str, tracked: frozenset[str]) -> list[Finding]:
    """``link`` findings of the Markdown file ``path`` against the tracked files."""
    directories = {posixpath.dirname(p) for p in tracked}
    directories |= {d for p in list(directories) for d in _parents(p)}
    findings = []
    base = posixpath.dirname(path)
    for number, target in link_targets(text):
        if _WEB.match(target) or target.startswith("#"):
            continue
        relative = unquote(target.split("#", 1)[0].split("?", 1)[0])
        if not relative:
            continue
        joined = relative.lstrip("/") if relative.startswith("/") else f"{base}/{relative}"
        resolved = posixpath.normpath(joined.lstrip("/"))
        if resolved == ".." or resolved.startswith("../"):
            findings.append(
                Finding(
                    path,
                    number,
                    "link",
                    f"{target!r} points outside the repository: a clone has no such file; "
                    "link a file inside the repository (or a web address)",
                )
            )
        elif resolved != "." and resolved not in tracked and resolved not in directories:
            findings.append(
                Finding(
                    path,
                    number,
                    "link",
                    f"{target!r} names {resolved!r}, which git does not track: fix the path "
                    "or add the file",
                )
            )
    return findings


def _parents(directory: str) -> Iterable[str]:
    while directory:
        directory = posixpath.dirname(directory)
        if directory:
            yield directory


def is_package_module(path: str) -> bool:
    """Whether ``path`` is a Python module of a package's source tree."""
    parts = path.split("/")
    return len(parts) > 4 and parts[0] == "packages" and parts[2] == "src" and path.endswith(".py")


def check_module_length(path: str, text: str, limit: int = MAX_MODULE_LINES) -> list[Finding]:
    """A ``module-length`` finding if ``path`` has more than ``limit`` lines."""
    lines = len(text.splitlines())
    if lines <= limit:
        return []
    return [
        Finding(
            path,
            limit + 1,
            "module-length",
            f"{lines} lines, over the {limit}-line limit for a package module: split it "
            "along its concepts",
        )
    ]


def check_repository(root: Path, limit: int = MAX_MODULE_LINES) -> list[Finding]:
    """Every finding of every rule over the files git tracks under ``root``, sorted."""
    tracked_list = tracked_files(root)
    tracked = frozenset(tracked_list)
    findings: list[Finding] = []
    for path in tracked_list:
        if not is_checked(path):
            continue
        text = read_text(root / path)
        if text is None:
            continue
        findings += check_history(path, text)
        if links_file(path):
            findings += check_links(path, text, tracked)
        if is_package_module(path):
            findings += check_module_length(path, text, limit)
    return sorted(findings)


def main(argv: Sequence[str] | None = None) -> int:
    """Print every finding; 0 when there is none, 1 otherwise."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--root",
        type=Path,
        default=Path(__file__).resolve().parents[1],
        help="the repository's root (default: the checkout holding this file)",
    )
    parser.add_argument(
        "--max-lines",
        type=int,
        default=MAX_MODULE_LINES,
        help=f"longest package module allowed (default: {MAX_MODULE_LINES})",
    )
    args = parser.parse_args(argv)
    findings = check_repository(args.root, args.max_lines)
    for finding in findings:
        print(finding)
    if findings:
        files = len({f.path for f in findings})
        print(f"check_repo: {len(findings)} finding(s) in {files} file(s)", file=sys.stderr)
        return 1
    print("check_repo: no findings", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
