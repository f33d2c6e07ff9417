"""Profile one target forward (decode T=1 and verify T=9) of a full-size preset, every
expert resident, with batch-invariant verification off and on.

Prints the wall time per forward (median of 10) and torch.profiler's top operators by
host time and by device time, so the per-forward overhead of each setting is visible.

    source scripts/gpu-env.sh && python3 scripts/profile_target_step.py --model deepseek-v2-lite
"""

from __future__ import annotations

import argparse
import time

import torch
from gpu_step_graphs import kernel_summary, step_ms  # a sibling script (scripts/ is on sys.path)
from torch.profiler import ProfilerActivity, profile

import specter_models


def forward_ms(lm, rows: int, start: int, repeats: int) -> float:
    """Median ms of a target forward of ``rows`` rows at ``start``."""
    ids = torch.arange(1, rows + 1, device=lm.device).unsqueeze(0)
    return step_ms(lm.target, ids, start, repeats)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="deepseek-v2-lite")
    p.add_argument("--rows", default="1,9")
    p.add_argument("--top", type=int, default=18)
    args = p.parse_args()
    t = time.perf_counter()
    # Eager steps: what this profile is about (see gpu_step_graphs.py for CUDA graphs).
    lm = specter_models.load(
        args.model, device="cuda", draft=None, max_seq_len=128, cuda_graphs=False
    )
    print(f"built {lm!r} in {time.perf_counter() - t:.1f} s", flush=True)
    prompt = torch.arange(3, 35, device="cuda").unsqueeze(0)
    lm.target.forward(prompt, 0)
    start = prompt.shape[1]
    for invariant in (False, True):
        lm.batch_invariant = invariant
        for rows in (int(r) for r in args.rows.split(",")):
            forward_ms(lm, rows, start, 3)  # warm-up: kernels compiled
            ms = forward_ms(lm, rows, start, 10)
            print(f"batch_invariant={invariant} T={rows}: {ms:.2f} ms per forward", flush=True)
        ids = torch.ones(1, 1, dtype=torch.long, device="cuda")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                lm.target.truncate(start)
                lm.target.forward(ids, start)
            torch.cuda.synchronize()
        label = f"eager target step (batch_invariant={invariant}, T=1)"
        print(kernel_summary(prof, label, 3), flush=True)
        table = prof.key_averages()
        print(f"--- batch_invariant={invariant}, 3 forwards of T=1: by host time", flush=True)
        print(table.table(sort_by="self_cpu_time_total", row_limit=args.top), flush=True)
        print(f"--- batch_invariant={invariant}: by device time", flush=True)
        print(table.table(sort_by="self_cuda_time_total", row_limit=args.top), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
