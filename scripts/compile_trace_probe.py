"""Which Triton kernels ``specter generate`` compiles, and in which phase of its run.

Runs ``specter generate ARGS...`` in this process with Triton's JIT hooks installed: every
kernel a process uses for the first time (its in-memory cache misses: a compile, or a load
from Triton's disk cache) is recorded with its phase (``load`` until the decode graphs'
capture starts, ``capture`` during it, ``decode`` after it: the prefill and the timed
decode), the seconds it took, its constexprs and the innermost specter frames that launched
it. One JSON line per kernel to ``--out``, then the generate's own statistics line
(``{"kind": "generate", ...}``; pass ``--json`` to generate for it).

    python scripts/compile_trace_probe.py --out trace.jsonl -- --model deepseek-v2-lite \
        --gpu-memory-gb 24 --max-new-tokens 64 --prompt-file p.txt --json --no-stream

Point ``TRITON_CACHE_DIR`` at an empty folder to see a fresh machine's compiles.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import time
import traceback

import triton

EVENTS: list[dict] = []
STATE = {"phase": "load", "pending": {}}


def _frames() -> list[str]:
    """The innermost specter frames of the current stack (file:line function)."""
    keep = []
    for frame in traceback.extract_stack()[:-3]:
        if "specter_" in frame.filename and "/triton/" not in frame.filename:
            keep.append(f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno} {frame.name}")
    return keep[-4:]


def _pre(*, key, repr, fn, compile, is_manual_warmup, already_compiled):
    STATE["pending"][id(key)] = time.perf_counter()
    return False


def _post(*, key, repr, fn, compile, is_manual_warmup, already_compiled):
    started = STATE["pending"].pop(id(key), None)
    constants = {
        str(k): v for k, v in compile.get("constants", {}).items() if isinstance(v, int | bool)
    }
    EVENTS.append(
        {
            "kind": "compile",
            "phase": STATE["phase"],
            "kernel": fn.name,
            "seconds": None if started is None else time.perf_counter() - started,
            "num_warps": compile.get("num_warps"),
            "constants": constants,
            "frames": _frames(),
        }
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("generate_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    rest = [a for a in args.generate_args if a != "--"]

    triton.knobs.runtime.jit_cache_hook = _pre
    triton.knobs.runtime.jit_post_compile_hook = _post

    from specter_bench import text_generation
    from specter_bench.cli import main as cli_main

    capture = text_generation.capture_decode_graphs

    def traced_capture(*a, **k):
        STATE["phase"] = "capture"
        try:
            return capture(*a, **k)
        finally:
            STATE["phase"] = "decode"

    text_generation.capture_decode_graphs = traced_capture
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        rc = cli_main(["generate", *rest])
    lines = stdout.getvalue().strip().splitlines()
    with open(args.out, "w") as f:
        for event in EVENTS:
            f.write(json.dumps(event) + "\n")
        if lines and lines[-1].startswith("{"):
            f.write(json.dumps({"kind": "generate", **json.loads(lines[-1])}) + "\n")
    by_phase: dict[str, list] = {}
    for event in EVENTS:
        by_phase.setdefault(event["phase"], []).append(event)
    for phase, events in by_phase.items():
        total = sum(e["seconds"] or 0.0 for e in events)
        print(f"{phase}: {len(events)} kernels, {total:.2f} s", file=sys.stderr)
        if phase == "decode":
            for e in events:
                print(f"  {e['kernel']} {e['seconds']:.3f} s {e['frames'][-1:]}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
