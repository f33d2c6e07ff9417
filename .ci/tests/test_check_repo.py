"""The repository checker: each rule fires on a bad sample and stays quiet on a good one.

The bad samples are assembled from pieces (``{SESSION}``, ``{ISSUE}``) so that this file,
which the checker reads like any other, does not break the rules it tests.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "check_repo.py"
_SPEC = importlib.util.spec_from_file_location("check_repo", _PATH)
check_repo = importlib.util.module_from_spec(_SPEC)
sys.modules["check_repo"] = check_repo
_SPEC.loader.exec_module(check_repo)

SESSION, ISSUE, ROUND, MACHINE = "session", "issue", "round", "machine"


@pytest.mark.parametrize(
    "line",
    [
        f"As measured in the fortieth {SESSION}, the cache wins.",
        f"## Forty-first {SESSION}",
        f"the 41st {SESSION}'s run",
        f"See the twenty-third {SESSION}s' records.",
        f"This {SESSION} moved the router.",
        f"left for the next {SESSION}",
        f"as the previous {SESSION} found",
        f"as earlier {SESSION}s measured",
        f"the last {SESSION} kept it",
        f"run {SESSION} 24 again",
        f"{ISSUE} 7's targets",
        f"see {ISSUE} #12",
        f"{ISSUE}s 3 and 4 asked for it",
        f"Review {ROUND} 3 split the module.",
        f"the second {ROUND} of review",
        f"run it on the GPU {MACHINE}",
    ],
)
def test_history_rule_fires_on_development_history(line):
    text = f"first line\n{line}\n"
    findings = check_repo.check_history("doc.md", text)
    assert [(f.path, f.line, f.rule) for f in findings] == [("doc.md", 2, "history")]


@pytest.mark.parametrize(
    "line",
    [
        "nox -s lint runs the lint session, then the tests sessions.",
        "session.run('python', '-m', 'pytest', *session.posargs)",
        "@nox.session(name='test-spec')",
        "nox.options.sessions = ['lint', 'tests']",
        "An HTTP session keeps its connection open.",
        "Report bugs on the project's GitHub issues.",
        "Known issues: none.",
        "the kernel issues wide loads; issue a copy on the side stream",
        "round to the nearest even; rounds half up; the ring comes round again",
        "round 0.5 up to 1",
        "Run it on a CUDA machine, or on a machine without internet access.",
        "The first run of a session warms the cache.",
    ],
)
def test_history_rule_stays_quiet_on_the_words_ordinary_uses(line):
    assert check_repo.check_history("doc.md", line) == []


def _repo(
    tmp_path: Path, files: dict[str, str | bytes], untracked: dict[str, str] | None = None
) -> Path:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    for name, content in {**files, **(untracked or {})}.items():
        file = tmp_path / name
        file.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            file.write_bytes(content)
        else:
            file.write_text(content)
    if files:
        subprocess.run(["git", "add", "--", *files], cwd=tmp_path, check=True)
    return tmp_path


GOOD_README = """# Project

[Architecture](docs/architecture.md), [its section](docs/architecture.md#loading),
[the docs folder](docs/), [scripts](./scripts), ![a plot](docs/img/plot.png "title"),
[the home page](https://example.org/x), [mail](mailto:a@example.org), [top](#project).
<img src="docs/img/plot.png" width="40">

[ref]: docs/architecture.md

```bash
cat [not a link](../outside.md)
```

Inline code is not a link: `[x](missing.md)`.
"""


def test_link_rule_stays_quiet_on_links_inside_the_repository(tmp_path):
    root = _repo(
        tmp_path,
        {
            "README.md": GOOD_README,
            "docs/architecture.md": "[back](../README.md) [plot](img/plot.png)\n",
            "docs/img/plot.png": b"\x89PNG\0\0",
            "scripts/train.py": "print('x')\n",
        },
    )
    assert check_repo.check_repository(root) == []


def test_link_rule_fires_on_links_outside_the_repository_or_to_missing_files(tmp_path):
    readme = "\n".join(
        [
            "# Project",
            "[design](../shared/DESIGN.md)",
            "[gone](docs/missing.md) and [root escape](/../etc/passwd)",
            "[untracked](notes.md)",
            "[ref]: docs/nothing.md",
            '<img src="docs/img/none.png">',
        ]
    )
    root = _repo(
        tmp_path,
        {"README.md": readme, "packages/p/README.md": "[up](../../../x.md)\n"},
        untracked={"notes.md": "on disk but not tracked\n"},
    )
    findings = check_repo.check_repository(root)
    assert [(f.path, f.line, f.rule) for f in findings] == [
        ("README.md", 2, "link"),
        ("README.md", 3, "link"),
        ("README.md", 3, "link"),
        ("README.md", 4, "link"),
        ("README.md", 5, "link"),
        ("README.md", 6, "link"),
        ("packages/p/README.md", 1, "link"),
    ]
    assert "outside the repository" in findings[0].message
    line_3 = sorted(f.message for f in findings if f.line == 3)
    assert "outside the repository" in line_3[0]
    assert "'docs/missing.md', which git does not track" in line_3[1]


def test_module_length_rule_fires_past_the_limit_in_package_sources_only(tmp_path):
    long, limit = "x = 1\n" * 601, "x = 1\n" * 600
    root = _repo(
        tmp_path,
        {
            "packages/p/src/p/big.py": long,
            "packages/p/src/p/sub/fine.py": limit,
            "packages/p/tests/test_big.py": long,
            "scripts/long.py": long,
        },
    )
    findings = check_repo.check_repository(root)
    assert [(f.path, f.line, f.rule) for f in findings] == [
        ("packages/p/src/p/big.py", 601, "module-length")
    ]
    assert "601 lines" in findings[0].message
    assert check_repo.check_repository(root, limit=601) == []


def test_every_finding_of_every_file_is_reported_and_skipped_files_are_not_read(tmp_path):
    bad = f"the tenth {SESSION}\n{ISSUE} 9\n"
    root = _repo(
        tmp_path,
        {
            "a.py": f"# {bad}",
            "docs/b.md": bad,
            "uv.lock": bad,
            "benchmarks/results/run.jsonl": bad,
            "benchmarks/results/README.md": bad,
            "image.bin": b"\0" + bad.encode(),
        },
    )
    findings = check_repo.check_repository(root)
    assert [(f.path, f.line) for f in findings] == [
        ("a.py", 1),
        ("a.py", 2),
        ("benchmarks/results/README.md", 1),
        ("benchmarks/results/README.md", 2),
        ("docs/b.md", 1),
        ("docs/b.md", 2),
    ]


def test_main_prints_findings_and_exits_nonzero_then_zero_once_fixed(tmp_path, capsys):
    root = _repo(tmp_path, {"README.md": f"the last {SESSION}\n[x](../y.md)\n"})
    assert check_repo.main(["--root", str(root)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("README.md:1: history: ")
    assert out[1].startswith("README.md:2: link: ")
    (root / "README.md").write_text("A product.\n")
    assert check_repo.main(["--root", str(root)]) == 0


def test_outside_a_git_checkout_it_says_so(tmp_path):
    with pytest.raises(SystemExit, match="inside a git checkout"):
        check_repo.check_repository(tmp_path)
