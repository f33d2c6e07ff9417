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


def _module_imports() -> dict[str, set[str]]:
    """Each module of the package -> the package modules it imports (at any depth of its code)."""
    import ast
    from pathlib import Path

    root = Path(specter_kernels.__file__).parent
    modules = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        modules[name] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            found.update(t for t in targets if t in modules and t != name)
        graph[name] = found
    return graph


def test_no_module_imports_itself_through_others():
    # The package's top level and subpackages' __init__ gather the modules below them; any
    # other import cycle between modules is a design error.
    graph = {
        name: {t for t in targets if not _is_package(t)}
        for name, targets in _module_imports().items()
        if not _is_package(name)
    }
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            raise AssertionError("import cycle: " + " -> ".join([*path[path.index(name) :], name]))
        if name in done:
            return
        for target in sorted(graph[name]):
            visit(target, [*path, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])


def _is_package(name: str) -> bool:
    import importlib.util

    spec = importlib.util.find_spec(name)
    return spec is not None and spec.submodule_search_locations is not None


def test_no_module_is_longer_than_600_lines():
    from pathlib import Path

    root = Path(specter_kernels.__file__).parent
    long = {
        str(p.relative_to(root)): n
        for p in root.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 600
    }
    assert long == {}
