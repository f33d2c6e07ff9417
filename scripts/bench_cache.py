"""GPU benchmark of specter-cache: transfer bandwidth through the cache, and overlap.

Usage: python3 scripts/bench_cache.py --out FILE.jsonl   (one CUDA GPU; --smoke on a CPU)

Measures, in one process on one GPU:

1. The ceiling: a raw pinned 1 GiB host-to-device copy (CUDA events, median).
2. Cache transfers for expert-sized loads (DeepSeek-V2-Lite / Qwen1.5-MoE: gate_up
   [2816, 2048] + down [2048, 1408] fp16 = 17.3 MB; Phi-3.5-MoE: gate_up [12800, 4096] + down
   [4096, 6400] fp16 = 157 MB): a prefetch of half the experts into slots that must evict
   the other half, timed from the first copy to the last on the copy stream (events) and from
   the host (wall, sync before and after). Also the same copies issued by a bare loop without
   the cache, and one expert's load latency.
3. Overlap: a bf16 matmul loop on the compute stream sized to take about as long as a
   prefetch batch, alone, the prefetch alone, and both together.
   overlap efficiency = (compute + transfer - together) / min(compute, transfer):
   1.0 means together = max(compute, transfer), 0.0 means together = their sum.
4. The verification pattern: acquire half resident, half missing experts and compute each
   wave with a large GEMM per expert (GPU-bound, not launch-bound), against the same compute
   alone and the missing loads alone (demand loads through ``acquire``).

Weights are seeded random data (values do not change copy speed). Writes JSON lines to
``--out`` and prints a table.

    source scripts/offline-env.sh && python3 scripts/bench_cache.py --out $OUT/cache.jsonl
    python3 scripts/bench_cache.py --smoke      # tiny sizes on the CPU: checks the script runs
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "packages" / "specter-cache" / "src"))

from specter_cache import ExpertCache, ExpertLayout, ExpertStore  # noqa: E402

MODELS = {
    # name: (hidden, expert intermediate, experts in the benchmark store)
    "deepseek-v2-lite": (2048, 1408, 64),
    "qwen1.5-moe": (2048, 1408, 60),
    "phi-3.5-moe": (4096, 6400, 16),
}


def layout_for(hidden: int, inter: int) -> ExpertLayout:
    return ExpertLayout(
        {"gate_up": ((2 * inter, hidden), torch.float16), "down": ((hidden, inter), torch.float16)}
    )


class Clock:
    """Host wall time with the device drained before and after."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def time(self, fn, reps: int) -> list[float]:
        out, self.host = [], []
        for _ in range(reps):
            self.sync()
            t0 = time.perf_counter()
            fn()
            self.host.append(time.perf_counter() - t0)  # the host's own time, before draining
            self.sync()
            out.append(time.perf_counter() - t0)
        return out


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def raw_pinned_bandwidth(device: torch.device, nbytes: int, reps: int) -> dict:
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=device.type == "cuda")
    host.random_(0, 255)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    if device.type != "cuda":
        secs = Clock(device).time(lambda: dev.copy_(host), reps)
        return {"bytes": nbytes, "median_s": median(secs), "gb_per_s": nbytes / median(secs) / 1e9}
    stream = torch.cuda.Stream()
    times = []
    for _ in range(reps + 1):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            start.record()
            dev.copy_(host, non_blocking=True)
            end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    times = times[1:]  # the first copy warms up
    return {
        "bytes": nbytes,
        "median_s": median(times),
        "min_s": min(times),
        "gb_per_s": nbytes / median(times) / 1e9,
        "reps": reps,
    }


def build_store(layout: ExpertLayout, experts: int, device: torch.device) -> ExpertStore:
    store = ExpertStore(1, experts, layout)
    g = torch.Generator(device=device).manual_seed(0)
    for e in range(experts):
        tensors = {
            name: torch.randn(spec.shape, generator=g, device=device, dtype=torch.float32).to(
                spec.dtype
            )
            for name, spec in layout.specs.items()
        }
        store.put(0, e, tensors)
    return store


def copy_stream_seconds(cache: ExpertCache, fn) -> tuple[float, float | None]:
    """Wall seconds of ``fn`` and, on CUDA, copy-stream seconds from its first copy to its last."""
    clock = Clock(cache.device)
    clock.sync()
    cache.completed_transfers()  # drop older batches
    t0 = time.perf_counter()
    fn()
    clock.sync()
    wall = time.perf_counter() - t0
    done = cache.completed_transfers()
    device_s = sum(s for _, s in done) if done else None
    return wall, device_s


def bench_transfers(name: str, device: torch.device, reps: int, scale: int) -> dict:
    hidden, inter, experts = MODELS[name]
    hidden, inter = hidden // scale, inter // scale
    layout = layout_for(hidden, inter)
    store = build_store(layout, experts, device)
    half = experts // 2
    cache = ExpertCache(store, slots_per_layer=half, device=device, policy="lru")
    halves = [list(range(half)), list(range(half, 2 * half))]
    batch_bytes = half * layout.payload_bytes
    cache.prefetch({0: halves[1]})  # warm up: fill the slots
    walls, devs = [], []
    for r in range(reps):
        wall, dev = copy_stream_seconds(cache, lambda r=r: cache.prefetch({0: halves[r % 2]}))
        walls.append(wall)
        if dev is not None:
            devs.append(dev)
    stats = cache.stats()["total"]
    assert stats["prefetch_loads"] == half * (reps + 1), stats  # every rep really loaded

    # The same copies without the cache: a bare loop over the slot views on one stream.
    slots = cache.slot_tensors(0)
    srcs = [store.get(0, e) for e in range(experts)]
    stream = torch.cuda.Stream() if device.type == "cuda" else None

    def bare(r: int) -> None:
        ctx = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
        with ctx:
            for i, e in enumerate(halves[r % 2]):
                for n in layout.names:
                    slots[n][i].copy_(srcs[e][n], non_blocking=True)

    bare(0)  # warm up
    bare_walls = [Clock(device).time(lambda r=r: bare(r), 1)[0] for r in range(reps)]

    # One expert's load latency on the copy stream: a one-slot cache alternating two experts.
    one_slot = ExpertCache(store, slots_per_layer=1, device=device)
    single = []
    for r in range(reps + 1):
        _, dev = copy_stream_seconds(one_slot, lambda r=r: one_slot.prefetch({0: [r % 2]}))
        if dev is not None and r > 0:
            single.append(dev)

    rec = {
        "kind": "transfer",
        "model": name,
        "expert_bytes": layout.payload_bytes,
        "batch_experts": half,
        "batch_bytes": batch_bytes,
        "cache_wall_median_s": median(walls),
        "cache_wall_gb_per_s": batch_bytes / median(walls) / 1e9,
        "bare_wall_median_s": median(bare_walls),
        "bare_wall_gb_per_s": batch_bytes / median(bare_walls) / 1e9,
        "reps": reps,
    }
    if devs:
        rec["cache_copy_stream_median_s"] = median(devs)
        rec["cache_copy_stream_gb_per_s"] = batch_bytes / median(devs) / 1e9
    if single:
        rec["single_expert_median_ms"] = median(single) * 1e3
    return rec


def matmul_loop(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, iters: int) -> None:
    for _ in range(iters):
        torch.mm(a, b, out=c)


def bench_overlap(device: torch.device, reps: int, scale: int, batch_experts: int) -> dict:
    hidden, inter, _ = MODELS["deepseek-v2-lite"]
    hidden, inter = hidden // scale, inter // scale
    layout = layout_for(hidden, inter)
    experts = 2 * batch_experts
    store = build_store(layout, experts, device)
    cache = ExpertCache(store, slots_per_layer=batch_experts, device=device)
    halves = [list(range(batch_experts)), list(range(batch_experts, experts))]
    clock = Clock(device)
    cache.prefetch({0: halves[1]})
    clock.sync()
    # Transfer alone.
    state = {"r": 0}

    def transfer() -> None:
        cache.prefetch({0: halves[state["r"] % 2]})
        state["r"] += 1

    transfer_s = median(clock.time(transfer, reps))
    # Size the matmul loop to about the transfer time.
    n = 4096 // scale
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(n, n, device=device, dtype=dtype) / n**0.5
    b = torch.randn(n, n, device=device, dtype=dtype) / n**0.5
    c = torch.empty_like(a)
    one = median(clock.time(lambda: matmul_loop(a, b, c, 20), 3)) / 20
    iters = max(1, round(transfer_s / one))
    compute_s = median(clock.time(lambda: matmul_loop(a, b, c, iters), reps))

    def together() -> None:
        matmul_loop(a, b, c, iters)  # enqueued on the compute stream
        transfer()  # copies on the copy stream

    together_s = median(clock.time(together, reps))
    eff = (compute_s + transfer_s - together_s) / min(compute_s, transfer_s)
    return {
        "kind": "overlap",
        "model": "deepseek-v2-lite",
        "batch_experts": batch_experts,
        "batch_bytes": batch_experts * layout.payload_bytes,
        "matmul_n": n,
        "matmul_iters": iters,
        "compute_s": compute_s,
        "transfer_s": transfer_s,
        "together_s": together_s,
        "max_s": max(compute_s, transfer_s),
        "sum_s": compute_s + transfer_s,
        "overlap_efficiency": eff,
        "reps": reps,
    }


def bench_acquire_overlap(device: torch.device, reps: int, scale: int, experts: int) -> dict:
    """Verification pattern: half the needed experts resident, half loaded while computing."""
    hidden, inter, _ = MODELS["deepseek-v2-lite"]
    hidden, inter = hidden // scale, inter // scale
    layout = layout_for(hidden, inter)
    half = experts // 2
    pool = experts + half  # two alternating sets of missing experts
    store = build_store(layout, pool, device)
    cache = ExpertCache(store, slots_per_layer=experts, device=device)
    resident = list(range(half))
    missing = [list(range(half, experts)), list(range(experts, experts + half))]
    clock = Clock(device)
    # One large GEMM per launch: the GPU, not the host's launch rate, bounds the compute.
    tokens = 8192 // scale
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    x = torch.randn(tokens, hidden, device=device, dtype=dtype)
    out = torch.empty(tokens, 2 * inter, device=device, dtype=dtype)
    per_expert_iters = {"n": 1}

    def expert_compute(slot: int) -> None:
        w = cache.slot_tensors(0)["gate_up"][slot].to(dtype)
        for _ in range(per_expert_iters["n"]):
            torch.mm(x, w.T, out=out)

    state = {"r": 0}

    def verify() -> None:
        needed = resident + missing[state["r"] % 2]
        state["r"] += 1
        for wave in cache.acquire(0, needed):
            for s in wave.slots:
                expert_compute(s)
            wave.release()

    cache.prefetch({0: resident + missing[1]})
    clock.sync()
    # Loads alone: the missing half, no compute.
    load_state = {"r": 0}

    def loads_only() -> None:
        for wave in cache.acquire(0, resident + missing[load_state["r"] % 2]):
            wave.release()
        load_state["r"] += 1

    transfer_s = median(clock.time(loads_only, reps))
    state["r"] = load_state["r"]

    def compute_only() -> None:
        for slot in range(experts):  # every slot once, like a verification
            expert_compute(slot)

    # Size each expert's compute to about one expert's transfer.
    one = median(clock.time(compute_only, 3)) / experts
    per_expert_iters["n"] = max(1, round(transfer_s / half / one))

    compute_s = median(clock.time(compute_only, reps))
    compute_host_s = median(clock.host)
    cache.reset_stats()
    together_s = median(clock.time(verify, reps))
    together_host_s = median(clock.host)
    st = cache.stats()["total"]
    eff = (compute_s + transfer_s - together_s) / min(compute_s, transfer_s)
    return {
        "kind": "acquire_overlap",
        "model": "deepseek-v2-lite",
        "needed_experts": experts,
        "resident_experts": half,
        "missing_experts": half,
        "tokens": tokens,
        "per_expert_iters": per_expert_iters["n"],
        "compute_host_s": compute_host_s,
        "together_host_s": together_host_s,
        "compute_s": compute_s,
        "transfer_s": transfer_s,
        "together_s": together_s,
        "overlap_efficiency": eff,
        "stall_s_per_verify": st["stall_seconds"] / reps,
        "waves_per_verify": st["waves"] / reps,
        "hit_rate": st["hit_rate"],
        "reps": reps,
    }


def identity(device: torch.device, commit: str | None) -> dict:
    if commit is None:
        try:
            commit = subprocess.run(
                ["git", "-C", str(ROOT), "rev-parse", "HEAD"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            commit = "unknown"
    return {
        "bench": "cache",
        "git_commit": commit,
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "weights": "random, seed 0",
        "date": time.strftime("%Y-%m-%d"),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", type=Path, default=None, help="JSON lines output file")
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--commit", default=None, help="git commit to record (default: git rev-parse)")
    p.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU")
    args = p.parse_args()
    if args.smoke:
        device, scale, raw_bytes, reps = torch.device("cpu"), 16, 1 << 24, 3
    else:
        if not torch.cuda.is_available():
            sys.exit("bench_cache.py needs a CUDA GPU (or --smoke for a CPU dry run)")
        device, scale, raw_bytes, reps = torch.device("cuda"), 1, 1 << 30, args.reps
    ident = identity(device, args.commit)
    records = []
    raw = raw_pinned_bandwidth(device, raw_bytes, reps)
    records.append({"kind": "raw_pinned_copy", **raw})
    ceiling = raw["gb_per_s"]
    for name in MODELS:
        rec = bench_transfers(name, device, reps, scale)
        best = rec.get("cache_copy_stream_gb_per_s", rec["cache_wall_gb_per_s"])
        rec["fraction_of_raw_copy_stream"] = best / ceiling
        rec["fraction_of_raw_wall"] = rec["cache_wall_gb_per_s"] / ceiling
        records.append(rec)
    records.append(bench_overlap(device, reps, scale, batch_experts=32))
    records.append(bench_acquire_overlap(device, reps, scale, experts=32))
    records = [{**ident, **r} for r in records]
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("w") as f:
            for r in records:
                f.write(json.dumps(r) + "\n")
    print(f"\nraw pinned 1 GiB copy: {ceiling:.1f} GB/s ({ident['gpu']})")
    print(
        "| model | expert MB | batch | cache copy-stream GB/s | cache wall GB/s | bare loop GB/s "
        "| vs raw | 1 expert ms |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in records:
        if r["kind"] == "transfer":
            print(
                f"| {r['model']} | {r['expert_bytes'] / 1e6:.1f} | {r['batch_experts']} "
                f"| {r.get('cache_copy_stream_gb_per_s', float('nan')):.1f} "
                f"| {r['cache_wall_gb_per_s']:.1f} | {r['bare_wall_gb_per_s']:.1f} "
                f"| {r['fraction_of_raw_copy_stream']:.1%} "
                f"| {r.get('single_expert_median_ms', float('nan')):.3f} |"
            )
    for r in records:
        if r["kind"] in ("overlap", "acquire_overlap"):
            print(
                f"{r['kind']}: compute {r['compute_s'] * 1e3:.2f} ms, transfer "
                f"{r['transfer_s'] * 1e3:.2f} ms, together {r['together_s'] * 1e3:.2f} ms "
                f"-> overlap efficiency {r['overlap_efficiency']:.1%}"
            )


if __name__ == "__main__":
    main()
