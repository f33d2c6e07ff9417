"""Profile the draft's one-row decode step of a full-size preset, every expert resident.

Prints the replayed CUDA-graph step time, the number of CUDA kernels one eager draft step
launches, their summed device time, and the kernels that take the most device time, so
what a fused draft step would save is visible (kernel count x per-kernel floor).

    source scripts/gpu-env.sh && python3 scripts/profile_draft_step.py --model deepseek-v2-lite
"""

from __future__ import annotations

import argparse
import time

import torch
from gpu_step_graphs import kernel_summary, step_ms  # a sibling script (scripts/ is on sys.path)
from torch.profiler import ProfilerActivity, profile

import specter_models


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="deepseek-v2-lite")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--fused-norms", type=int, default=1)
    args = p.parse_args()
    t = time.perf_counter()
    lm = specter_models.load(
        args.model, device="cuda", max_seq_len=256, fused_norms=bool(args.fused_norms)
    )
    print(f"built {lm!r} in {time.perf_counter() - t:.1f} s", flush=True)
    prompt = torch.arange(3, 35, device="cuda").unsqueeze(0)
    lm.target.forward(prompt, 0)
    start = prompt.shape[1]
    ids = torch.ones(1, 1, dtype=torch.long, device="cuda")
    graphed = step_ms(lm.draft, ids, start, 5)  # first call captures
    graphed = step_ms(lm.draft, ids, start, 20)
    print(f"draft step, CUDA graph replay: {graphed:.3f} ms", flush=True)
    with lm.draft.graphs_paused():
        eager = step_ms(lm.draft, ids, start, 10)
        print(f"draft step, eager: {eager:.3f} ms", flush=True)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                lm.draft.truncate(start)
                lm.draft.forward(ids, start)
            torch.cuda.synchronize()
    print(kernel_summary(prof, "eager draft step", 3), flush=True)
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
