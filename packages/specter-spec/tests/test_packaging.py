"""Packaging invariants of specter-spec: its version and what importing it pulls in."""

import subprocess
import sys
from importlib.metadata import version

import specter_spec


def test_version_matches_distribution_metadata():
    assert specter_spec.__version__ == version("specter-spec")


def test_import_pulls_in_no_higher_or_forbidden_package():
    # The design's dependency graph: lower packages never import higher ones.
    forbidden = [
        "transformers",
        "triton",
        "specter_kernels",
        "specter_cache",
        "specter_models",
        "specter_bench",
    ]
    code = "import sys, specter_spec; print(' '.join(m for m in {forbidden!r} if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code.format(forbidden=forbidden)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert out == [], f"importing specter_spec imported {out}"


def test_every_public_name_is_importable_from_the_package():
    missing = [name for name in specter_spec.__all__ if not hasattr(specter_spec, name)]
    assert missing == []
