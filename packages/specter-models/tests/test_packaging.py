"""Packaging invariants of specter-models: its version and what importing it pulls in."""

import subprocess
import sys
from importlib.metadata import version

import specter_models


def test_version_matches_distribution_metadata():
    assert specter_models.__version__ == version("specter-models")


def test_import_pulls_in_no_higher_or_forbidden_package():
    # The design's dependency graph: lower packages never import higher ones.
    forbidden = ["specter_bench"]
    code = (
        "import sys, specter_models; print(' '.join(m for m in {forbidden!r} if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code.format(forbidden=forbidden)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out == [], f"importing specter_models imported {out}"
