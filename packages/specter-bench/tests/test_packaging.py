"""Packaging invariants of specter-bench: its version, its exports, what importing it pulls in."""

import subprocess
import sys
from importlib.metadata import version

import specter_bench


def test_version_matches_distribution_metadata():
    assert specter_bench.__version__ == version("specter-bench")


def test_every_export_resolves():
    for name in specter_bench.__all__:
        assert getattr(specter_bench, name) is not None, name


def test_import_and_cli_light_commands_do_not_load_transformers():
    code = (
        "import sys, specter_bench, specter_bench.cli, specter_bench.report; "
        "print('transformers' in sys.modules, 'specter_models' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False"]


def test_no_export_is_shadowed_by_a_submodule():
    # Importing specter_bench.<name> would rebind the package attribute to the module.
    import importlib.util

    for name in specter_bench.__all__:
        assert importlib.util.find_spec(f"specter_bench.{name}") is None, name
