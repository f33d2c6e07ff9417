"""Run identity: commit, versions, weights."""

import re

import torch

from specter_bench.run_identity import collect_identity, git_commit, package_versions


def test_identity_names_commit_versions_and_weights(monkeypatch):
    monkeypatch.delenv("SPECTER_GIT_COMMIT", raising=False)
    identity = collect_identity(weights="random (seed 7)", device="cpu", dtype=torch.float32)
    assert identity["weights"] == "random (seed 7)"
    assert identity["dtype"] == "float32"
    assert identity["gpu"] is None or isinstance(identity["gpu"], str)
    assert re.fullmatch(r"([0-9a-f]{40}(\+dirty)?|unknown)", identity["git_commit"])
    versions = identity["versions"]
    assert (
        versions["torch"] == torch.__version__.split("+")[0]
        or versions["torch"] == torch.__version__
    )
    assert versions["specter-bench"] == "0.1.0"
    assert set(package_versions()) >= {"transformers", "specter-cache", "specter-models"}


def test_commit_override_for_copies_without_git(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECTER_GIT_COMMIT", "0123abc")
    assert git_commit() == "0123abc"
    monkeypatch.delenv("SPECTER_GIT_COMMIT")
    assert git_commit(tmp_path) == "unknown"  # not a checkout
