"""Packaging invariants of specter-kernels: its version and what importing it pulls in."""

import subprocess
import sys
from importlib.metadata import version

import specter_kernels


def test_version_matches_distribution_metadata():
    assert specter_kernels.__version__ == version("specter-kernels")


def test_import_pulls_in_no_higher_or_forbidden_package():
    # The design's dependency graph: lower packages never import higher ones.
    forbidden = ["transformers", "specter_cache", "specter_spec", "specter_models", "specter_bench"]
    code = (
        "import sys, specter_kernels; print(' '.join(m for m in {forbidden!r} if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code.format(forbidden=forbidden)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out == [], f"importing specter_kernels imported {out}"
