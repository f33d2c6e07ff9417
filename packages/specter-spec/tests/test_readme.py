"""The README's usage example runs as written."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_blocks_run_in_order():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    assert len(blocks) >= 4  # models, sampling + streaming, observer, depth
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)
    # The asserts inside the blocks checked exactness; check the observer too.
    events = namespace["log"].events
    assert events[:4] == ["draft K=2", "token 0", "token 1", "verify 3 rows"]
    assert events[4].startswith("accepted ")
