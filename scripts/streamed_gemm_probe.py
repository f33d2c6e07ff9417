"""How fast the grouped FP16 kernel streams missing experts from pinned host memory.

The timeline probe (docs/benchmarks.md, twelfth session) found a 24 GB verification's
kernels streaming at about 18 GB/s, where a plain zero-copy read (scripts/zero_copy_probe.py)
reaches 41-45 GB/s. This probe times DeepSeek-V2-Lite's MoE layer (H 2048, I 1408, 64
experts, top-6) through ``grouped_moe_fp16`` with ``--rows`` routed rows of which
``--streamed`` experts have no slot and are read in place from pinned host memory, against
the same launch with every expert resident, and prints the streamed bytes' rate (their
bytes over the time the launch takes beyond the resident one; median of ``--repeats``):

* ``per-pair``: the verification's batch-invariant mode (``out [T, k, H]``), with its own
  tiles and with each ``--per-pair-configs`` shape swapped in (``block_n / stages / warps``
  and optionally ``/ block_k``, default 128: block_k fixes a pair's summation order, the same
  for every row count, so another one keeps batch invariance but not today's bits; wider
  K steps read longer contiguous runs of each weight row from the host);
* ``accumulate`` with each ``--configs`` tile shape (``block_n x block_k / stages``, given to
  ``launch_grouped`` for both projections);
* ``staged``: ``stage_streamed`` into a ``--staging``-expert buffer, then the per-pair launch
  with its own tiles, reading the staged experts from device memory (the time includes the
  staging copy).

    source scripts/gpu-env.sh && python3 scripts/streamed_gemm_probe.py
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

import specter_kernels as sk
from specter_kernels.moe import grouped_fp16_triton
from specter_kernels.moe.grouped_fp16_triton import GroupedConfig, launch_grouped

default_per_pair = grouped_fp16_triton.per_pair_configs

H, INTER, E, K = 2048, 1408, 64, 6


def _ms(fn, repeats: int) -> float:
    times = []
    for r in range(repeats + 2):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        if r >= 2:  # the first two compile and warm
            times.append(a.elapsed_time(b))
    return statistics.median(times)


def _launcher(shape: str | None, x, ids, weights, shared):
    """``(run, out)``: ``run(expert_to_slot, streamed)`` is one MoE layer launch into
    ``out``, per-pair (``shape`` None) or accumulating with the tile ``shape``
    (``block_n x block_k / stages``) for both projections."""
    slots13, slots2, every, flags = shared
    rows = x.shape[0]
    if shape is None:
        out = torch.zeros(rows, K, H, device="cuda")

        def run(slot_map, stream):
            sk.grouped_moe_fp16(
                x, ids, weights, slots13, slots2, slot_map, every, out, None,
                stream, flags if stream is not None else None,
            )  # fmt: skip

        return run, out
    tile, stages = shape.split("/")
    bn, bk = (int(v) for v in tile.split("x"))
    config = GroupedConfig(16, bn, bk, num_warps=4, num_stages=int(stages))
    out = torch.zeros(rows, H, device="cuda")

    def run(slot_map, stream):
        launch_grouped(
            x, ids, weights, slots13, slots2, slot_map, every, out, config, config, None,
            stream, flags if stream is not None else None,
        )  # fmt: skip

    return run, out


def _staged(run, ids, every, staging):
    """``run`` with the streamed experts staged first (``stage_streamed``): the launch then
    reads the staged ones from the buffer."""

    def staged_run(slot_map, stream):
        if stream is not None:
            stream = sk.stage_streamed(ids, slot_map, every, stream, staging)
        run(slot_map, stream)

    return staged_run


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="1,7")
    p.add_argument("--streamed", default="1,3,6")
    p.add_argument("--configs", default="64x128/4,32x256/3,16x512/2,128x64/4,64x64/6")
    p.add_argument("--per-pair-configs", default="32/4/4,16/4/4,64/2/4,64/6/8,128/3/8")
    p.add_argument("--staging", type=int, default=8, help="staging slots (0: no staged mode)")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--out", default=None, help="append the JSON lines here")
    args = p.parse_args()
    torch.manual_seed(0)
    w13 = (torch.randn(E, 2 * INTER, H) * 0.02).half().pin_memory()
    w2 = (torch.randn(E, H, INTER) * 0.02).half().pin_memory()
    streamed = sk.StreamedExperts.from_tensors(list(w13), list(w2), "cuda")
    slots13, slots2 = w13.cuda(), w2.cuda()
    every = torch.ones(E, dtype=torch.bool, device="cuda")
    resident = torch.arange(E, device="cuda", dtype=torch.int32)
    flags = torch.zeros(2, E, dtype=torch.uint8, device="cuda")
    expert_bytes = (3 * H * INTER) * 2
    staging = sk.StagingBuffer.allocate(args.staging, E, H, INTER, "cuda") if args.staging else None
    records = []
    for rows in (int(r) for r in args.rows.split(",")):
        x = torch.randn(rows, H, device="cuda").half()
        weights = torch.rand(rows, K, device="cuda")
        # Row r routes to experts (r + j) mod 12: 6-12 distinct experts, ids 0-11.
        ids = torch.tensor([[(r + j) % 12 for j in range(K)] for r in range(rows)], device="cuda")
        routed = sorted(set(ids.reshape(-1).tolist()))
        for count in (int(c) for c in args.streamed.split(",")):
            count = min(count, len(routed))
            missing = torch.zeros(E, dtype=torch.bool)
            missing[routed[:count]] = True
            mapping = torch.where(missing, -1, torch.arange(E)).int().cuda()
            shapes = [("per-pair", None)]
            shapes += [("per-pair", f"pp:{c}") for c in args.per_pair_configs.split(",") if c]
            shapes += [("accumulate", c) for c in args.configs.split(",") if c]
            if staging is not None:
                shapes.append(("staged", None))
            for mode, shape in shapes:
                if shape is not None and shape.startswith("pp:"):
                    bn, stages, warps, *rest = (int(v) for v in shape[3:].split("/"))
                    bk = rest[0] if rest else 128
                    tile = GroupedConfig(16, bn, bk, num_warps=warps, num_stages=stages)
                    grouped_fp16_triton.per_pair_configs = lambda device, t=tile: (t, t)
                    shape_arg = None
                else:
                    grouped_fp16_triton.per_pair_configs = default_per_pair
                    shape_arg = shape
                run, out = _launcher(shape_arg, x, ids, weights, (slots13, slots2, every, flags))
                if mode == "staged":
                    run = _staged(run, ids, every, staging)
                out.zero_()
                run(resident, None)
                expected = out.clone()
                out.zero_()
                run(mapping, streamed)
                equal = bool(torch.equal(out, expected))  # same bits from the host
                base = _ms(lambda run=run: run(resident, None), args.repeats)
                with_host = _ms(lambda run=run, m=mapping: run(m, streamed), args.repeats)
                extra = max(with_host - base, 1e-6)
                record = {
                    "rows": rows,
                    "streamed": count,
                    "mode": mode,
                    "tile": shape or "per-pair default",
                    "resident_ms": base,
                    "streamed_ms": with_host,
                    "streamed_gb_per_s": count * expert_bytes / extra / 1e6,
                    "whole_launch_gb_per_s": count * expert_bytes / with_host / 1e6,
                    "equal": equal,
                }
                records.append(record)
                print(json.dumps(record), flush=True)
    if args.out:
        with open(args.out, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
