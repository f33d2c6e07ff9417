"""Packaging invariants of specter-bench: its version and what importing it pulls in."""

from importlib.metadata import version

import specter_bench


def test_version_matches_distribution_metadata():
    assert specter_bench.__version__ == version("specter-bench")
