"""Sweep the batch-invariant GEMV (``specter_kernels.invariant.gemv_triton``) against the
tensor-core invariant matmul's shipped tile and cuBLAS, timed inside CUDA graphs.

Each timing graph replays launches over distinct weights (more bytes than the L2 holds, see
``sweep_invariant_matmul.py``), so a launch's time is what a decode step pays for it. For each
shape and candidate (BLOCK_N, warps, rows a pass): the time at
M = 1 and M = 5, whether row 0's bits are equal at both, and the largest error against an
fp32 reference. Per shape, the best invariant candidate by ``ROW_WEIGHTS`` (3 x the 1-row
time + the 5-row time) goes to ``--write-config``, as the GEMV's tile where it beats the
tensor-core kernel's weighted time, else as ``"kernel": "mma"``.

    python3 scripts/sweep_invariant_gemv.py --from-records a.jsonl b.jsonl --write-config f.json

rebuilds the tuned file from earlier sweeps' records. ``--keep-from FILE`` adds FILE's entries
for the shapes this sweep (or these records) did not cover, so a sweep of one model's shapes
updates the shipped file without dropping the others':

    tuned=packages/specter-kernels/src/specter_kernels/invariant/tuned/invariant_gemv_nvidia_h200.json
    python3 scripts/sweep_invariant_gemv.py --shapes qwen,phi --out $OUT/gemv.jsonl \
        --write-config $OUT/tuned.json --keep-from $tuned

    source scripts/gpu-env.sh && python3 scripts/sweep_invariant_gemv.py --out $OUT/gemv.jsonl
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import time

import torch
import torch.nn.functional as F
import triton
from sweep_invariant_matmul import SHAPES, graph_us  # a sibling script (scripts/ on sys.path)

from specter_kernels.invariant.gemv_config import ROW_WEIGHTS, InvariantGemvConfig
from specter_kernels.invariant.gemv_triton import launch_invariant_gemv
from specter_kernels.invariant.matmul_config import matmul_config
from specter_kernels.invariant.matmul_triton import launch_invariant_bmm

ROWS = (1, 5)
GRAPH_BYTES = 256 << 20


def candidates(N: int, K: int, dtype: torch.dtype) -> list[InvariantGemvConfig]:
    """Tiles whose weight stretch is 8-128 elements a thread (64 for fp32), 1-8 rows a pass."""
    width = triton.next_power_of_2(K)
    found = []
    # One- and two-warp tiles were not in the twenty-second session's sweeps: with one warp a
    # row's sum needs no cross-warp step (no shared memory, no barrier; 3-5 barriers a row
    # at 4 warps in the sm_90 PTX), which is where a row's ~1 us goes.
    for bn, warps, rows in itertools.product((1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8)):
        per_thread = bn * width / (32 * warps)
        if 8 <= per_thread <= 128 * 2 // dtype.itemsize and bn <= triton.next_power_of_2(N):
            found.append(InvariantGemvConfig(bn, warps, rows))
    return found


def sweep_shape(name: str, N: int, K: int, dtype: torch.dtype, device_name: str, f):
    """Time cuBLAS, the MMA kernel's shipped tile and every GEMV candidate at one shape; one
    JSON line per candidate to ``f``; the best invariant candidate's tuned entry (or None)."""
    copies = max(4, min(64, GRAPH_BYTES // (N * K * dtype.itemsize)))
    weights = torch.randn(copies, N, K, device="cuda", dtype=dtype) / K**0.5
    x = torch.randn(max(ROWS), K, device="cuda", dtype=dtype)
    ref = (x.double() @ weights[-1].double().T).float()
    outs = {m: torch.empty(m, N, device="cuda", dtype=dtype) for m in ROWS}
    linear = {m: graph_us(lambda i, m=m: F.linear(x[:m], weights[i]), copies) for m in ROWS}
    mma = matmul_config(N, K, dtype, device_name)
    mma_us = {
        m: graph_us(
            lambda i, m=m: launch_invariant_bmm(
                x[None, :m], weights[i].T[None], outs[m][None], config=mma
            ),
            copies,
        )
        for m in ROWS
    }
    results = []
    for config in candidates(N, K, dtype):
        launch = functools.partial(launch_invariant_gemv, config=config)
        try:
            us = {
                m: graph_us(
                    lambda i, m=m, launch=launch: launch(x[:m], weights[i], outs[m], None),
                    copies,
                )
                for m in ROWS
            }
        except Exception as exc:  # a tile that does not compile or fit
            print(f"{name} {config}: {type(exc).__name__}: {exc}", flush=True)
            continue
        record = {
            "kind": "gemv", "shape": name, "N": N, "K": K,
            "dtype": str(dtype).removeprefix("torch."),
            "block_n": config.block_n, "num_warps": config.num_warps, "rows": config.rows,
            "invariant": torch.equal(outs[1][0], outs[5][0]),
            "max_err": (outs[5].float() - ref).abs().max().item(),
            **{f"us_m{m}": us[m] for m in ROWS},
            **{f"mma_us_m{m}": mma_us[m] for m in ROWS},
            **{f"linear_us_m{m}": linear[m] for m in ROWS},
            "gbps_m1": N * K * dtype.itemsize / us[1] / 1e3,
        }  # fmt: skip
        results.append(record)
        f.write(json.dumps(record) + "\n")
        f.flush()
    good = [r for r in results if r["invariant"]]
    if not good:
        print(f"{name}: no invariant candidate", flush=True)
        return None
    best = min(good, key=lambda r: weighted(r, "us"))
    use_gemv = weighted(best, "us") < weighted(best, "mma_us")
    print(
        f"{name:26s} N={N:6d} K={K:5d} cuBLAS {linear[1]:6.2f}/{linear[5]:6.2f} us"
        f" | mma {mma_us[1]:6.2f}/{mma_us[5]:6.2f} | gemv {best['us_m1']:6.2f}/"
        f"{best['us_m5']:6.2f} ({best['gbps_m1']:.0f} GB/s) bn={best['block_n']} "
        f"w={best['num_warps']} rows={best['rows']} err={best['max_err']:.1e}"
        f" | {len(results)} timed, non-invariant {len(results) - len(good)}"
        f" -> {'gemv' if use_gemv else 'mma'}",
        flush=True,
    )
    return tuned_entry(best, use_gemv)


def weighted(record: dict, prefix: str) -> float:
    """The 1- and 5-row times weighed as ``ROW_WEIGHTS`` says (the kernel choice's measure)."""
    return sum(w * record[f"{prefix}_m{m}"] for m, w in ROW_WEIGHTS.items())


def tuned_entry(best: dict, use_gemv: bool) -> dict:
    """A tuned-file entry: the GEMV tile, or ``"kernel": "mma"`` with the times of both."""
    entry = {"N": best["N"], "K": best["K"], "dtype": best["dtype"]}
    if use_gemv:
        entry.update(kernel="gemv", block_n=best["block_n"], num_warps=best["num_warps"],
                     rows=best["rows"])  # fmt: skip
    else:
        entry["kernel"] = "mma"
    entry.update({
        "gemv_graph_us_m1": round(best["us_m1"], 2), "gemv_graph_us_m5": round(best["us_m5"], 2),
        "mma_graph_us_m1": round(best["mma_us_m1"], 2),
        "mma_graph_us_m5": round(best["mma_us_m5"], 2),
        "linear_graph_us_m1": round(best["linear_us_m1"], 2),
    })  # fmt: skip
    return entry


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help="JSON lines, one per candidate (a sweep)")
    p.add_argument("--shapes", default=None, help="comma-separated name prefixes")
    p.add_argument("--max-seconds", type=float, default=300.0)
    p.add_argument("--write-config", default=None)
    p.add_argument("--from-records", nargs="+", default=None, help="earlier sweeps' records")
    p.add_argument("--device-name", default="NVIDIA H200", help="with --from-records")
    p.add_argument(
        "--keep-from", default=None, help="a tuned file whose other shapes' entries are kept"
    )
    args = p.parse_args()
    if args.from_records:
        return rebuild(args.from_records, args.device_name, args.write_config, args.keep_from)
    if not args.out:
        p.error("--out is required for a sweep")
    start = time.perf_counter()
    torch.manual_seed(0)
    shapes = SHAPES
    if args.shapes:
        shapes = tuple(s for s in SHAPES if s[0].startswith(tuple(args.shapes.split(","))))
    tuned = []
    device_name = torch.cuda.get_device_name()
    with open(args.out, "w") as f:
        for name, N, K, dtype in shapes:
            if time.perf_counter() - start > args.max_seconds:
                print(f"time limit: stopped before {name}", flush=True)
                break
            entry = sweep_shape(name, N, K, dtype, device_name, f)
            if entry is not None:
                tuned.append(entry)
    print(f"done in {time.perf_counter() - start:.0f} s", flush=True)
    if args.write_config:
        write_config(args.write_config, device_name, tuned, args.keep_from)
    return 0


def write_config(path: str, device_name: str, tuned: list[dict], keep_from: str | None) -> None:
    """Write the tuned file: ``tuned``, then ``keep_from``'s entries of other shapes."""
    if keep_from:
        covered = {(e["N"], e["K"], e["dtype"]) for e in tuned}
        with open(keep_from) as f:
            kept = [
                e for e in json.load(f)["configs"] if (e["N"], e["K"], e["dtype"]) not in covered
            ]
        print(f"kept {len(kept)} entries of other shapes from {keep_from}", flush=True)
        tuned = tuned + kept
    with open(path, "w") as f:
        json.dump({"device": device_name, "torch": torch.__version__,
                   "triton": triton.__version__,
                   "source": "scripts/sweep_invariant_gemv.py (CUDA-graph timing, bit-invariant "
                             "candidates, kernel and tile by 3 x the 1-row + the 5-row time)",
                   "configs": tuned}, f, indent=1)  # fmt: skip
        f.write("\n")


def rebuild(paths: list[str], device_name: str, out: str | None, keep_from: str | None) -> int:
    """The tuned file from earlier sweeps' records (the last record of a shape and tile wins)."""
    by_shape: dict[tuple, dict[tuple, dict]] = {}
    for path in paths:
        with open(path) as f:
            lines = f.readlines()
        for line in lines:
            r = json.loads(line)
            tile = (r["block_n"], r["num_warps"], r.get("rows", 1))
            by_shape.setdefault((r["N"], r["K"], r["dtype"]), {})[tile] = r
    tuned = []
    for records in by_shape.values():
        good = [r for r in records.values() if r["invariant"]]
        if good:
            best = min(good, key=lambda r: weighted(r, "us"))
            entry = tuned_entry(best, weighted(best, "us") < weighted(best, "mma_us"))
            tuned.append(entry)
            print(json.dumps(entry))
    if out:
        write_config(out, device_name, tuned, keep_from)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
