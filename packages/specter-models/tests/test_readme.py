"""The README's examples run as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).parents[1] / "README.md"


def test_readme_python_blocks_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    assert len(blocks) == 3
    namespace: dict[str, object] = {}
    for block in blocks:  # the third block uses names from the second
        exec(compile(block, str(README), "exec"), namespace)
    generation = namespace["generation"]
    assert generation.stats["new_tokens"] == len(generation.token_ids) == 24  # type: ignore[attr-defined]
    assert generation.text.strip()  # type: ignore[attr-defined]
    assert namespace["result"].tokens  # type: ignore[attr-defined]
    assert namespace["logits"].shape[:2] == (1, 4)  # type: ignore[attr-defined]
