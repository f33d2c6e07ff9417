"""The README's Python examples run as written."""

import re
from pathlib import Path

README = Path(__file__).parent.parent / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_python_examples_run(capsys):
    blocks = _python_blocks()
    assert len(blocks) == 3
    for block in blocks:
        exec(compile(block, str(README), "exec"), {"__name__": "readme"})
    out = capsys.readouterr().out
    assert "| tiny-deepseek-v2 | unlimited | specter |" in out
    assert "(no target)" in out
    # The acceptance example prints two means, each strictly between 0 and 1.
    means = [float(v) for v in re.findall(r"tensor\(([0-9.]+)\)", out.splitlines()[-1])]
    assert len(means) == 2
    assert all(0 < m < 1 for m in means)
