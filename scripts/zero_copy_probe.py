"""How fast a Triton kernel reads pinned host memory directly (zero-copy, over PCIe).

Reads ``--experts`` DeepSeek-V2-Lite-sized FP16 expert records (17.3 MB each) from pinned
host memory through device-side int64 addresses cast to pointers, summing them, and prints
the bandwidth beside the same kernel over device memory and beside the copy engine's
pinned host-to-device copy of the same bytes. A miss path that streams a missing expert's
weights straight into the GEMV, without a host decision, is worth building only if this
is close to the copy engine.

    source scripts/gpu-env.sh && python3 scripts/zero_copy_probe.py
"""

from __future__ import annotations

import argparse
import statistics

import torch
import triton
import triton.language as tl


@triton.jit
def _sum_kernel(addr_ptr, out_ptr, n_elems, BLOCK: tl.constexpr, CHUNKS: tl.constexpr):
    e = tl.program_id(1)
    base = tl.load(addr_ptr + e).to(tl.pointer_type(tl.float16))
    start = tl.program_id(0) * BLOCK * CHUNKS
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for c in range(CHUNKS):
        offs = start + c * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(base + offs, mask=offs < n_elems, other=0.0).to(tl.float32)
    tl.atomic_add(out_ptr + e, tl.sum(acc))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--experts", default="1,2,4,8,16")
    p.add_argument("--repeats", type=int, default=10)
    args = p.parse_args()
    n = 3 * 2048 * 1408  # one expert's fp16 elements
    counts = [int(c) for c in args.experts.split(",")]
    most = max(counts)
    host = torch.randn(most, n, dtype=torch.float16).pin_memory()
    dev = host.cuda()
    landing = torch.empty_like(dev)
    out = torch.zeros(most, device="cuda", dtype=torch.float32)
    ref = dev.float().sum(dim=1)
    for block, chunks in ((1024, 8), (2048, 4), (4096, 4), (1024, 32)):
        grid0 = triton.cdiv(n, block * chunks)
        for count in counts:
            rows = []
            for name, src in (("host", host), ("device", dev)):
                addrs = torch.tensor(
                    [src[i].data_ptr() for i in range(count)], dtype=torch.int64, device="cuda"
                )
                times = []
                for r in range(args.repeats + 1):
                    out.zero_()
                    a, b = (
                        torch.cuda.Event(enable_timing=True),
                        torch.cuda.Event(enable_timing=True),
                    )
                    a.record()
                    _sum_kernel[(grid0, count)](addrs, out, n, BLOCK=block, CHUNKS=chunks)
                    b.record()
                    b.synchronize()
                    if r:
                        times.append(a.elapsed_time(b))
                ok = torch.allclose(out[:count], ref[:count], rtol=1e-3, atol=1.0)
                ms = statistics.median(times)
                rows.append(f"{name} {ms:.3f} ms {count * n * 2 / ms / 1e6:.1f} GB/s ok={ok}")
            times = []
            for r in range(args.repeats + 1):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                landing[:count].copy_(host[:count], non_blocking=True)
                b.record()
                b.synchronize()
                if r:
                    times.append(a.elapsed_time(b))
            ms = statistics.median(times)
            rows.append(f"copy {ms:.3f} ms {count * n * 2 / ms / 1e6:.1f} GB/s")
            print(f"block {block} x{chunks}, {count} experts: " + " | ".join(rows), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
