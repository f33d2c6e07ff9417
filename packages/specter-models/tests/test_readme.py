"""The README's examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).parents[1] / "README.md"


def test_readme_python_blocks_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    assert len(blocks) == 2
    namespace: dict[str, object] = {}
    for block in blocks:  # the second block uses names from the first
        exec(compile(block, str(README), "exec"), namespace)
    assert namespace["result"].tokens  # type: ignore[attr-defined]
    assert namespace["logits"].shape[:2] == (1, 4)  # type: ignore[attr-defined]
