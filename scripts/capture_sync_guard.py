"""A pytest plugin for the GPU machine: report every host sync or stream query made while
the current CUDA stream is capturing a graph (each one invalidates the capture).

    python3 -m pytest -p capture_sync_guard ...   (with scripts/ on PYTHONPATH)

Each offending call prints ``CAPTURE-SYNC <name>`` and the Python stack that made it to
stderr, once per distinct stack; the call then goes ahead, so the capture fails as it
would have. Diagnostics only: nothing in the packages imports this.
"""

from __future__ import annotations

import functools
import sys
import traceback

import torch

_seen: set[str] = set()


def _capturing() -> bool:
    try:
        return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
    except Exception:  # a query that fails is itself worth no report
        return False


def _guard(owner, name: str) -> None:
    original = getattr(owner, name)

    @functools.wraps(original)
    def guarded(*args, **kwargs):
        if _capturing():
            stack = "".join(traceback.format_stack()[:-1][-14:])
            if stack not in _seen:
                _seen.add(stack)
                print(f"CAPTURE-SYNC {owner.__name__}.{name}\n{stack}", file=sys.stderr, flush=True)
        return original(*args, **kwargs)

    setattr(owner, name, guarded)


for _owner, _names in (
    (torch.cuda, ("synchronize",)),
    (torch.cuda.Event, ("synchronize", "query", "elapsed_time")),
    (torch.cuda.Stream, ("synchronize", "query")),
    (torch.Tensor, ("item", "tolist", "cpu", "__bool__", "nonzero")),
):
    for _name in _names:
        _guard(_owner, _name)


def pytest_configure(config) -> None:  # pytest's hook signature
    print("capture_sync_guard: host syncs under capture are reported", file=sys.stderr)
