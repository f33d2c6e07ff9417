"""Nox sessions for the Specter workspace.

Every test session builds its own environment from ``uv.lock`` holding exactly
one package, its declared dependencies and its ``test`` dependency group, so an
import that a package forgot to declare fails that package's session.

    nox -l                      # list sessions
    nox -s lint tests           # what CI runs (.ci/run)
    nox -s test-cache           # one package
    nox -s tests-newest         # spec, cache and models against the newest torch/transformers
    nox -s bench-dsv2           # a model's benchmark (needs a CUDA GPU)

On a machine without internet access (preinstalled torch/transformers/triton) run a
session in the current environment instead of building one::

    source scripts/offline-env.sh && nox --no-venv -s bench-dsv2

With ``--no-venv`` nothing is installed: the packages are imported from their
``src`` folders through the ``PYTHONPATH`` that ``scripts/offline-env.sh`` sets.
"""

from __future__ import annotations

import os
import shutil
import tomllib
from pathlib import Path

import nox

ROOT = Path(__file__).parent
PACKAGES = ("kernels", "cache", "spec", "models", "bench")
# Packages whose tests run against the newest torch and transformers (tests-newest).
NEWEST_PACKAGES = ("spec", "cache", "models")
BENCH_MODELS = {
    "bench-dsv2": "deepseek-v2-lite",
    "bench-qwen": "qwen1.5-moe",
    "bench-phi": "phi-3.5-moe",
}

nox.options.default_venv_backend = "uv"
nox.options.error_on_missing_interpreters = True
nox.options.sessions = ["lint", "tests"]


def _in_current_env(session: nox.Session) -> bool:
    return session.venv_backend == "none"


def sync(session: nox.Session, package: str, *groups: str) -> None:
    """Install one workspace package (and its locked dependencies) into the session env."""
    if _in_current_env(session):
        session.log("--no-venv: using the current environment, installing nothing")
        return
    args = ["uv", "sync", "--locked", "--no-python-downloads", "--package", package]
    for group in groups:
        args += ["--group", group]
    session.run_install(*args, env={"UV_PROJECT_ENVIRONMENT": session.virtualenv.location})


def _package_tests(session: nox.Session, short: str) -> None:
    package = f"specter-{short}"
    sync(session, package, "test")
    session.chdir(ROOT / "packages" / package)
    # Exit code 5 ("no tests collected") is a failure: every package has tests.
    session.run("python", "-m", "pytest", *session.posargs, env={"PYTHONHASHSEED": "0"})


for _short in PACKAGES:

    def _make(short: str):
        def _session(session: nox.Session) -> None:
            _package_tests(session, short)

        _session.__doc__ = f"Run specter-{short}'s tests in an environment holding only it."
        return _session

    nox.session(name=f"test-{_short}")(_make(_short))


@nox.session
def tests(session: nox.Session) -> None:
    """Run every package's tests, each in its own environment."""
    for short in PACKAGES:
        session.notify(f"test-{short}", posargs=session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check over the whole workspace, then check-repo."""
    session.notify("check-repo")
    if not _in_current_env(session):
        session.run_install(
            "uv",
            "sync",
            "--locked",
            "--no-python-downloads",
            "--only-group",
            "lint",
            env={"UV_PROJECT_ENVIRONMENT": session.virtualenv.location},
        )
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session(name="check-repo")
def check_repo(session: nox.Session) -> None:
    """The repository checker's own tests, then the checker over every tracked file
    (.ci/check_repo.py: development history in prose, links leaving the repository or
    naming missing files, package modules over the line limit)."""
    if not _in_current_env(session):
        session.run_install(
            "uv",
            "sync",
            "--locked",
            "--no-python-downloads",
            "--only-group",
            "dev",
            env={"UV_PROJECT_ENVIRONMENT": session.virtualenv.location},
        )
    session.chdir(ROOT)
    session.run("python", "-m", "pytest", "-q", ".ci/tests")
    session.run("python", ".ci/check_repo.py")


def _workspace_dependencies(short: str) -> list[str]:
    """``specter-<short>`` and the workspace packages it depends on, dependencies first."""
    order: list[str] = []

    def visit(package: str) -> None:
        if package in order:
            return
        pyproject = tomllib.loads((ROOT / "packages" / package / "pyproject.toml").read_text())
        for requirement in pyproject["project"].get("dependencies", []):
            name = requirement.split(";")[0].strip()
            if name.startswith("specter-"):
                visit(name)
        order.append(package)

    visit(f"specter-{short}")
    return order


def _newest_tests(session: nox.Session, short: str) -> None:
    package = f"specter-{short}"
    if _in_current_env(session):
        session.error(f"{session.name} installs the newest torch and transformers: drop --no-venv")
    pyproject = tomllib.loads((ROOT / "packages" / package / "pyproject.toml").read_text())
    test_group = pyproject.get("dependency-groups", {}).get("test", [])
    local = [str(ROOT / "packages" / name) for name in _workspace_dependencies(short)]
    # --no-config: the workspace's constraint-dependencies pin torch and transformers to the
    # lock's versions; these sessions take what the registries serve today.
    session.install("--no-config", *local, *test_group)
    session.install("--no-config", "--upgrade", "torch", "transformers")
    session.run(
        "python",
        "-c",
        "import torch, transformers; "
        "print('torch', torch.__version__, 'transformers', transformers.__version__)",
    )
    session.chdir(ROOT / "packages" / package)
    session.run("python", "-m", "pytest", *session.posargs, env={"PYTHONHASHSEED": "0"})


for _short in NEWEST_PACKAGES:

    def _make_newest(short: str):
        def _session(session: nox.Session) -> None:
            _newest_tests(session, short)

        _session.__doc__ = (
            f"Run specter-{short}'s tests against the newest torch and transformers (no lock)."
        )
        return _session

    nox.session(name=f"newest-{_short}", default=False)(_make_newest(_short))


@nox.session(name="tests-newest", default=False)
def tests_newest(session: nox.Session) -> None:
    """Run the spec, cache and models tests against the newest torch and transformers the
    registries serve (not the lock), each package in its own environment."""
    for short in NEWEST_PACKAGES:
        session.notify(f"newest-{short}", posargs=session.posargs)


def _bench(session: nox.Session, model: str) -> None:
    if not _in_current_env(session) and shutil.which("nvidia-smi") is None:
        session.error(
            f"{session.name} benchmarks {model} and needs a CUDA GPU; this machine has none "
            "(no nvidia-smi). Run it on a CUDA machine: "
            "`source scripts/offline-env.sh && nox --no-venv -s " + session.name + "`."
        )
    sync(session, "specter-bench")
    has_gpu = session.run(
        "python", "-c", "import torch; print(int(torch.cuda.is_available()))", silent=True
    )
    if not has_gpu or has_gpu.strip().splitlines()[-1] != "1":
        session.error(
            f"{session.name} needs a CUDA GPU; torch sees none "
            "(torch.cuda.is_available() is False)."
        )
    session.run(
        "python",
        "-m",
        "specter_bench",
        "bench",
        "--model",
        model,
        "--experiment",
        "default",
        *session.posargs,
        env={
            "PYTHONUNBUFFERED": "1",
            **({} if "OUT" not in os.environ else {"OUT": os.environ["OUT"]}),
        },
    )


for _name, _model in BENCH_MODELS.items():

    def _make_bench(model: str):
        def _session(session: nox.Session) -> None:
            _bench(session, model)

        _session.__doc__ = f"Run the default benchmark experiment for {model} (CUDA GPU only)."
        return _session

    nox.session(name=_name)(_make_bench(_model))
