"""Does a tiny host-to-device copy on a second stream wait behind queued expert copies?

specter-cache's streamed path takes an evicted expert off the device map on a side stream
(``CudaCopyEngine.map_stream``) so that a verification can wait for that entry without
waiting for the data copies queued on the copy stream. This probe queues ``--copies``
expert-sized pinned host-to-device copies on one stream, then on a high-priority second
stream either a 4-byte pinned host-to-device copy or a one-element fill kernel, each with
an event, and prints how long after being queued each event completed, against the data
copies' total (ms, median of ``--repeats``).

    source scripts/gpu-env.sh && python3 scripts/copy_queue_probe.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch


def _done_after(event: torch.cuda.Event, started: float) -> float:
    while not event.query():
        pass
    return 1e3 * (time.perf_counter() - started)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--copies", type=int, default=40)
    p.add_argument("--expert-mb", type=float, default=17.3)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    n = int(args.expert_mb * 2**20) // 2
    host = [torch.randn(n, dtype=torch.float16).pin_memory() for _ in range(4)]
    dev = torch.empty(args.copies, n, dtype=torch.float16, device="cuda")
    data_stream = torch.cuda.Stream()
    map_stream = torch.cuda.Stream(priority=-1)
    entry = torch.zeros(8, dtype=torch.int32, device="cuda")
    value = torch.full((1,), -1, dtype=torch.int32).pin_memory()
    result: dict[str, list[float]] = {"data_ms": [], "tiny_copy_ms": [], "fill_kernel_ms": []}
    for _ in range(args.repeats + 1):
        for mode in ("tiny_copy_ms", "fill_kernel_ms"):
            torch.cuda.synchronize()
            started = time.perf_counter()
            with torch.cuda.stream(data_stream):
                for i in range(args.copies):
                    dev[i].copy_(host[i % 4], non_blocking=True)
                data_done = torch.cuda.Event()
                data_done.record(data_stream)
            with torch.cuda.stream(map_stream):
                if mode == "tiny_copy_ms":
                    entry[:1].copy_(value, non_blocking=True)
                else:
                    entry[:1].fill_(-1)
                side_done = torch.cuda.Event()
                side_done.record(map_stream)
            side = _done_after(side_done, started)
            data = _done_after(data_done, started)
            result[mode].append(side)
            result["data_ms"].append(data)
    summary = {k: statistics.median(v[2:]) for k, v in result.items()}  # first repeat warms
    summary.update(copies=args.copies, expert_mb=args.expert_mb)
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
