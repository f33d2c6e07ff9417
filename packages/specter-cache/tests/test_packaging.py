"""Packaging invariants of specter-cache: its version and what importing it pulls in."""

import subprocess
import sys
from importlib.metadata import version

import specter_cache


def test_version_matches_distribution_metadata():
    assert specter_cache.__version__ == version("specter-cache")


def test_import_pulls_in_no_higher_or_forbidden_package():
    # The design's dependency graph: lower packages never import higher ones.
    forbidden = [
        "transformers",
        "triton",
        "specter_kernels",
        "specter_spec",
        "specter_models",
        "specter_bench",
    ]
    code = (
        "import sys, specter_cache; print(' '.join(m for m in {forbidden!r} if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code.format(forbidden=forbidden)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out == [], f"importing specter_cache imported {out}"
