"""The README's usage example runs and its assertion holds."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_usage_example_runs(monkeypatch):
    monkeypatch.delenv("SPECTER_KERNELS_BACKEND", raising=False)
    match = re.search(r"## Usage\n\n```python\n(.*?)```", README.read_text(), re.S)
    assert match, "README.md lost its usage example"
    namespace: dict = {}
    exec(compile(match.group(1), str(README), "exec"), namespace)
    out, expected_tokens = namespace["out"], namespace["T"]
    assert out.shape == (expected_tokens, namespace["H"])
    assert bool(out.abs().sum() > 0)


def test_readme_batch_invariant_example_runs(monkeypatch):
    monkeypatch.delenv("SPECTER_KERNELS_BACKEND", raising=False)
    section = README.read_text().split("## Batch-invariant mode", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "README.md lost its batch-invariant example"
    namespace: dict = {}
    exec(compile(match.group(1), str(README), "exec"), namespace)  # asserts inside
    assert namespace["all_rows"].shape == (9, 128)
