"""Kernel benchmark of specter-kernels on one CUDA GPU (not a test: it times things).

Usage: python3 scripts/bench_kernels.py [--sweep] --out DIR   (one CUDA GPU)

For the routed-expert shapes of DeepSeek-V2-Lite, Qwen1.5-MoE and Phi-3.5-MoE and
T in {1, 2, 4, 8, 16, 32} it validates, then times, one MoE layer (both
projections) through:

* ``fused_w4a16``      specter_kernels.fused_moe_w4a16 (auto path), plus the forced
                       ``gemv`` and ``tile`` paths;
* ``seq_w4a16``        per-expert sequential W4A16 (gather, 2 launches per expert, index_add);
* ``dequant_fp16``     dequantize the routed experts, then the grouped FP16 kernel;
* ``hf_grouped_mm``    transformers.integrations.moe.grouped_mm_experts_forward, fp16;
* ``hf_batched_mm``    transformers.integrations.moe.batched_mm_experts_forward, fp16;
* ``grouped_fp16``     specter_kernels.grouped_moe_fp16 over fp16 slots (all experts resident);

and, for T in 9..33, the grouped FP16 kernel against both transformers paths.
Each path is first checked against a torch reference (relative Frobenius
error), then timed as a CUDA graph holding R calls that rotate through 4
weight sets and 4 input sets (so repeated calls cannot be served from L2),
median over many replays; eager (no graph) medians are recorded too. Rooflines
are the weight bytes the routed experts touch over 4.25 TB/s.

    source scripts/offline-env.sh                           # without internet access
    python3 scripts/bench_kernels.py --out "$OUT"            # full benchmark
    python3 scripts/bench_kernels.py --sweep --out "$OUT"    # tile-shape sweep first

Writes JSON lines to ``<out>/kernels.jsonl`` and prints a compact table.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

import specter_kernels as sk
from specter_kernels.moe import w4a16_configs, w4a16_triton
from specter_kernels.moe.w4a16_triton import GemvConfig, TileConfig

COPY_BANDWIDTH = 4.25e12  # bytes/s, device-to-device copy measured on the H200 (BENCHMARK.md)
NUM_SETS = 4  # weight sets and input sets rotated through
NAN = float("nan")
DEVICE = "cuda"


@dataclass(frozen=True)
class ModelShape:
    name: str
    hidden: int  # H
    intermediate: int  # I (per routed expert)
    experts: int  # E
    top_k: int


MODELS = {
    "deepseek-v2-lite": ModelShape("deepseek-v2-lite", 2048, 1408, 64, 6),
    "qwen1.5-moe": ModelShape("qwen1.5-moe", 2048, 1408, 60, 4),
    "phi-3.5-moe": ModelShape("phi-3.5-moe", 4096, 6400, 16, 2),
}


def log(msg: str) -> None:
    print(msg, flush=True)


# --------------------------------------------------------------------------- timing


def time_graph(fns: list[Callable[[], object]], reps: int = 8, budget_s: float = 0.25) -> float:
    """Median microseconds per call of a CUDA graph replaying ``reps`` rotating calls."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for fn in fns:
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for r in range(reps):
            fns[r % len(fns)]()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    first = start.elapsed_time(end) / 1e3
    replays = int(max(5, min(40, budget_s / max(first, 1e-6))))
    times = []
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / reps)
    del graph
    return statistics.median(times)


def time_eager(fns: list[Callable[[], object]], reps: int = 8, budget_s: float = 0.15) -> float:
    """Median microseconds per call of plain launches (CPU launch overhead included)."""
    for fn in fns:
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    deadline = time.perf_counter() + budget_s
    while len(times) < 5 or (time.perf_counter() < deadline and len(times) < 40):
        start.record()
        for r in range(reps):
            fns[r % len(fns)]()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / reps)
    return statistics.median(times)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.float(), ref.float()
    if not torch.isfinite(out).all():
        return float("inf")
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))


# --------------------------------------------------------------------------- problem


class HFExperts(torch.nn.Module):
    """The attributes transformers' experts forward functions read (fp16 weights)."""

    def __init__(self, gate_up: torch.Tensor, down: torch.Tensor) -> None:
        super().__init__()
        self.gate_up_proj = gate_up
        self.down_proj = down
        self.num_experts = gate_up.shape[0]
        self.has_gate = True
        self.has_bias = False
        self.is_transposed = False
        self.act_fn = F.silu

    def _apply_gate(self, gate_up_out: torch.Tensor) -> torch.Tensor:
        from transformers.integrations import moe

        return moe._default_apply_gate(self, gate_up_out)


@dataclass
class WeightSet:
    w13_fp16: torch.Tensor  # [E, 2I, H]
    w2_fp16: torch.Tensor  # [E, H, I]
    w13: sk.Int4Weight
    w2: sk.Int4Weight
    hf: HFExperts


@dataclass
class InputSet:
    x: torch.Tensor
    ids: torch.Tensor
    weights: torch.Tensor
    used: torch.Tensor  # experts routed to, ascending
    used_list: list[int]
    slot_of: torch.Tensor  # int32 [E]: index of each expert in `used` (dequant_fp16's slots)
    groups: list[tuple[int, torch.Tensor, torch.Tensor]]  # (expert, tokens, slots)


def make_weights(shape: ModelShape, seed: int) -> WeightSet:
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    E, H, inter = shape.experts, shape.hidden, shape.intermediate
    w13 = (torch.randn(E, 2 * inter, H, device=DEVICE, generator=g) * 0.02).half()
    w2 = (torch.randn(E, H, inter, device=DEVICE, generator=g) * 0.02).half()
    return WeightSet(
        w13, w2, sk.quantize_int4(w13, 128), sk.quantize_int4(w2, 128), HFExperts(w13, w2)
    )


def make_inputs(shape: ModelShape, T: int, seed: int) -> InputSet:
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    x = torch.randn(T, shape.hidden, device=DEVICE, generator=g).half()
    logits = torch.randn(T, shape.experts, device=DEVICE, generator=g)
    weights, ids = torch.topk(torch.softmax(logits, -1), shape.top_k, dim=-1)
    used = torch.unique(ids)
    groups = []
    for e in used.tolist():
        tokens, slots = torch.nonzero(ids == e, as_tuple=True)
        groups.append((e, tokens, slots))
    slot_of = torch.searchsorted(used, torch.arange(shape.experts, device=DEVICE))
    slot_of = slot_of.clamp(max=len(used) - 1).to(torch.int32)
    return InputSet(x, ids, weights, used, used.tolist(), slot_of, groups)


def expert_bytes(shape: ModelShape, ws: WeightSet) -> tuple[float, float]:
    """(INT4 incl. scales, FP16) bytes of one expert, both projections."""
    int4 = ws.w13.nbytes_per_expert + ws.w2.nbytes_per_expert
    fp16 = 3 * shape.hidden * shape.intermediate * 2
    return int4, fp16


# --------------------------------------------------------------------------- paths


def seq_w4a16(ws: WeightSet, inp: InputSet) -> torch.Tensor:
    out = torch.zeros(inp.x.shape, dtype=torch.float32, device=DEVICE)
    for e, tokens, slots in inp.groups:
        xe = inp.x[tokens]
        ids = torch.zeros(len(tokens), 1, dtype=torch.int32, device=DEVICE)
        y = sk.fused_moe_w4a16(
            xe, ids, inp.weights[tokens, slots].unsqueeze(1), ws.w13.experts(e), ws.w2.experts(e)
        )
        out.index_add_(0, tokens, y.float())
    return out.half()


def dequant_fp16(ws: WeightSet, inp: InputSet) -> torch.Tensor:
    slot_map = inp.slot_of
    w13 = sk.dequantize_int4(ws.w13.experts(inp.used))
    w2 = sk.dequantize_int4(ws.w2.experts(inp.used))
    out = torch.zeros(inp.x.shape, dtype=torch.float32, device=DEVICE)
    mask = torch.ones(slot_map.shape[0], dtype=torch.bool, device=DEVICE)
    sk.grouped_moe_fp16(inp.x, inp.ids, inp.weights, w13, w2, slot_map, mask, out)
    return out.half()


def grouped_fp16(ws: WeightSet, inp: InputSet, identity: torch.Tensor, mask: torch.Tensor):
    out = torch.zeros(inp.x.shape, dtype=torch.float32, device=DEVICE)
    sk.grouped_moe_fp16(inp.x, inp.ids, inp.weights, ws.w13_fp16, ws.w2_fp16, identity, mask, out)
    return out.half()


def hf_path(name: str):
    from transformers.integrations import moe

    forward = {
        "hf_grouped_mm": moe.grouped_mm_experts_forward,
        "hf_batched_mm": moe.batched_mm_experts_forward,
    }[name]
    return lambda ws, inp: forward(ws.hf, inp.x, inp.ids, inp.weights)


def fp16_reference(ws: WeightSet, inp: InputSet) -> torch.Tensor:
    E = ws.w13_fp16.shape[0]
    out = torch.zeros(inp.x.shape, dtype=torch.float32, device=DEVICE)
    identity = torch.arange(E, dtype=torch.int32, device=DEVICE)
    mask = torch.ones(E, dtype=torch.bool, device=DEVICE)
    return sk.grouped_moe_fp16_reference(
        inp.x, inp.ids, inp.weights, ws.w13_fp16, ws.w2_fp16, identity, mask, out
    )


# --------------------------------------------------------------------------- runner


class Recorder:
    def __init__(self, out_dir: Path, meta: dict) -> None:
        self.path = out_dir / "kernels.jsonl"
        self.meta = meta
        self.rows: list[dict] = []

    def add(self, **row) -> None:
        row = {**self.meta, **row}
        self.rows.append(row)
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")


def measure(
    rec: Recorder, fns, check, base: dict, eager: bool = True, budget_s: float = 0.15
) -> dict:
    """Validate (check() -> rel err), then time; never raise (the error is recorded)."""
    row = dict(base)
    try:
        row["rel_err"] = check()
    except Exception as exc:  # record and continue: one broken path must not end the run
        row["error"] = f"{type(exc).__name__}: {exc}"[:500]
        traceback.print_exc()
        rec.add(**row)
        return row
    try:
        row["us_graph"] = time_graph(fns, budget_s=budget_s)
    except Exception as exc:  # e.g. a path that cannot be captured: time it eagerly
        row["graph_error"] = f"{type(exc).__name__}: {exc}"[:300]
        torch.cuda.synchronize()
        eager = True
    try:
        if eager:
            row["us_eager"] = time_eager(fns)
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {exc}"[:500]
    rec.add(**row)
    return row


def bench_model(rec: Recorder, shape: ModelShape, tokens: list[int], grouped_tokens: list[int]):
    dims = f"H={shape.hidden} I={shape.intermediate} E={shape.experts} k={shape.top_k}"
    log(f"== {shape.name}: {dims}")
    sets = [make_weights(shape, seed) for seed in range(NUM_SETS)]
    int4_b, fp16_b = expert_bytes(shape, sets[0])
    E = shape.experts
    identity = torch.arange(E, dtype=torch.int32, device=DEVICE)
    all_mask = torch.ones(E, dtype=torch.bool, device=DEVICE)
    summary = {}
    for T in tokens + [t for t in grouped_tokens if t not in tokens]:
        inputs = [make_inputs(shape, T, 1000 * T + i) for i in range(NUM_SETS)]
        distinct = statistics.mean(len(i.used_list) for i in inputs)
        base = {
            "model": shape.name,
            "T": T,
            "H": shape.hidden,
            "I": shape.intermediate,
            "E": E,
            "top_k": shape.top_k,
            "distinct_experts": distinct,
            "int4_bytes": distinct * int4_b,
            "fp16_bytes": distinct * fp16_b,
            "roofline_int4_us": distinct * int4_b / COPY_BANDWIDTH * 1e6,
            "roofline_fp16_us": distinct * fp16_b / COPY_BANDWIDTH * 1e6,
        }
        pairs = list(zip(sets, inputs, strict=True))
        ws0, in0 = pairs[0]
        ref_int4 = sk.fused_moe_w4a16_reference(in0.x, in0.ids, in0.weights, ws0.w13, ws0.w2)
        ref_fp16 = fp16_reference(ws0, in0)
        paths: dict[str, tuple[Callable, torch.Tensor]] = {}
        if T in tokens:
            paths["fused_w4a16"] = (
                lambda ws, i: sk.fused_moe_w4a16(i.x, i.ids, i.weights, ws.w13, ws.w2),
                ref_int4,
            )
            for forced in ("gemv", "tile"):
                paths[f"fused_w4a16_{forced}"] = (
                    lambda ws, i, p=forced: sk.fused_moe_w4a16(
                        i.x, i.ids, i.weights, ws.w13, ws.w2, path=p
                    ),
                    ref_int4,
                )
            paths["seq_w4a16"] = (seq_w4a16, ref_int4)
            paths["dequant_fp16"] = (dequant_fp16, ref_int4)
        paths["grouped_fp16"] = (lambda ws, i: grouped_fp16(ws, i, identity, all_mask), ref_fp16)
        paths["hf_grouped_mm"] = (hf_path("hf_grouped_mm"), ref_fp16)
        paths["hf_batched_mm"] = (hf_path("hf_batched_mm"), ref_fp16)
        for name, (fn, ref) in paths.items():
            fns = [lambda ws=ws, i=i, fn=fn: fn(ws, i) for ws, i in pairs]
            row = measure(
                rec,
                fns,
                lambda fn=fn, ref=ref, ws0=ws0, in0=in0: rel_err(fn(ws0, in0), ref),
                {**base, "path": name},
                eager=name == "fused_w4a16",  # others: eager only where graphs fail
                budget_s=0.1 if T in tokens else 0.05,
            )
            summary[(T, name)] = row
            graph, eager = row.get("us_graph", NAN), row.get("us_eager", NAN)
            log(
                f"  T={T:<3d} {name:<20s} graph {graph:9.1f} us  eager {eager:9.1f} us"
                f"  err {row.get('rel_err', NAN):.1e}"
                + (f"  ERROR {row['error']}" if "error" in row else "")
            )
        summary[(T, "roofline_int4")] = {"us_graph": base["roofline_int4_us"]}
        summary[(T, "roofline_fp16")] = {"us_graph": base["roofline_fp16_us"]}
    del sets
    torch.cuda.empty_cache()
    return summary


def prefill_check(rec: Recorder, shape: ModelShape, T: int) -> None:
    """Correctness (and time) of the fused kernel at a prefill size."""
    ws = make_weights(shape, 7)
    inp = make_inputs(shape, T, 7)
    ref = sk.fused_moe_w4a16_reference(inp.x, inp.ids, inp.weights, ws.w13, ws.w2)
    fn = lambda: sk.fused_moe_w4a16(inp.x, inp.ids, inp.weights, ws.w13, ws.w2)
    row = measure(
        rec,
        [fn],
        lambda: rel_err(fn(), ref),
        {"model": shape.name, "T": T, "path": "fused_w4a16_prefill"},
        eager=False,
    )
    align = lambda: sk.moe_align_block_size(inp.ids, shape.experts, 64)
    ref_align = sk.moe_align_block_size_reference(inp.ids, shape.experts, 64)
    arow = measure(
        rec,
        [align],
        lambda: float(not all(torch.equal(a, b) for a, b in zip(align(), ref_align, strict=True))),
        {"model": shape.name, "T": T, "path": "moe_align_bs64"},
        eager=False,
    )
    log(
        f"  prefill T={T}: fused {row.get('us_graph', NAN):.0f} us err {row.get('rel_err')}; "
        f"align {arow.get('us_graph', NAN):.1f} us mismatch={arow.get('rel_err')}"
    )
    torch.cuda.empty_cache()


# --------------------------------------------------------------------------- sweep


def sweep(rec: Recorder, shape: ModelShape, tokens: list[int]) -> None:
    """Time tile shapes of both paths (one projection varied at a time)."""
    log(f"== sweep {shape.name}")
    sets = [make_weights(shape, seed) for seed in range(NUM_SETS)]
    H, inter, k, E = shape.hidden, shape.intermediate, shape.top_k, shape.experts
    gemv_gu = [
        GemvConfig(bn, bk, sp, w, 2, m)
        for bn, bk, sp, w, m in [
            (32, 256, 1, 4, 1),
            (32, 256, 2, 4, 1),
            (32, 256, 4, 4, 1),
            (32, 256, 8, 4, 1),
            (32, 128, 8, 4, 1),
            (32, 128, 16, 4, 1),
            (16, 256, 4, 4, 1),
            (64, 256, 4, 4, 1),
            (64, 128, 8, 4, 1),
            (32, 256, 4, 4, 0),
            (32, 512, 2, 4, 1),
            (32, 256, 4, 2, 1),
        ]
    ]
    gemv_dn = [
        GemvConfig(bn, bk, sp, w, 2, m)
        for bn, bk, sp, w, m in [
            (64, 128, 1, 4, 1),
            (64, 128, 2, 4, 1),
            (64, 128, 4, 4, 1),
            (64, 128, 8, 4, 1),
            (64, 256, 2, 4, 1),
            (32, 128, 4, 4, 1),
            (128, 128, 4, 4, 1),
            (64, 128, 4, 4, 0),
            (64, 64, 8, 4, 1),
        ]
    ]
    tile_gu = [
        TileConfig(16, bn, bk, sp, 4, 3)
        for bn, bk, sp in [
            (64, 128, 1),
            (64, 128, 2),
            (64, 128, 4),
            (64, 128, 8),
            (32, 128, 4),
            (128, 128, 4),
            (64, 256, 4),
        ]
    ]
    tile_dn = [
        TileConfig(16, bn, bk, sp, 4, 3)
        for bn, bk, sp in [
            (64, 128, 1),
            (64, 128, 2),
            (64, 128, 4),
            (64, 128, 8),
            (128, 128, 4),
            (32, 128, 4),
        ]
    ]
    for T in tokens:
        inputs = [make_inputs(shape, T, 500 + i) for i in range(NUM_SETS)]
        ws0, in0 = sets[0], inputs[0]
        ref = sk.fused_moe_w4a16_reference(in0.x, in0.ids, in0.weights, ws0.w13, ws0.w2)
        d_gu, d_dn = w4a16_configs.gemv_configs(in0.x.device, T, k, H, inter)
        t_gu, t_dn = w4a16_configs.tile_configs(in0.x.device, T, k, E, H, inter)
        t_gu = TileConfig(
            16, t_gu.block_n, t_gu.block_k, t_gu.split_k, t_gu.num_warps, t_gu.num_stages
        )
        t_dn = TileConfig(
            16, t_dn.block_n, t_dn.block_k, t_dn.split_k, t_dn.num_warps, t_dn.num_stages
        )
        cases = [("gemv", gu, d_dn, "gate_up") for gu in gemv_gu]
        cases += [("gemv", d_gu, dn, "down") for dn in gemv_dn]
        cases += [("tile", gu, t_dn, "gate_up") for gu in tile_gu]
        cases += [("tile", t_gu, dn, "down") for dn in tile_dn]
        for path, gu, dn, varied in cases:
            launch = w4a16_triton.launch_gemv if path == "gemv" else w4a16_triton.launch_tile
            fns = [
                lambda ws=ws, i=i, gu=gu, dn=dn, launch=launch: launch(
                    i.x, i.ids, i.weights, ws.w13, ws.w2, gu, dn
                )
                for ws, i in zip(sets, inputs, strict=True)
            ]
            row = measure(
                rec,
                fns,
                lambda fn=fns[0], ref=ref: rel_err(fn(), ref),
                {
                    "model": shape.name,
                    "T": T,
                    "path": f"sweep_{path}_{varied}",
                    "gate_up_config": gu.__dict__,
                    "down_config": dn.__dict__,
                },
                eager=False,
            )
            cfg = gu if varied == "gate_up" else dn
            log(
                f"  T={T:<3d} {path:<4s} {varied:<7s} {cfg}  {row.get('us_graph', NAN):8.1f} us"
                f"  err {row.get('rel_err', NAN):.1e}"
            )
    del sets
    torch.cuda.empty_cache()


# --------------------------------------------------------------------------- report


def copy_bandwidth() -> float:
    """Device-to-device copy bandwidth (bytes read + written), after a clock warm-up."""
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device=DEVICE).random_(0, 255)
    dst = torch.empty_like(src)
    deadline = time.perf_counter() + 1.0
    while time.perf_counter() < deadline:
        dst.copy_(src)
        torch.cuda.synchronize()
    us = time_graph([lambda: dst.copy_(src)], reps=4, budget_s=0.2)
    return 2 * n / (us * 1e-6)


def best_us(row: dict) -> float:
    """A path's time: its CUDA-graph median, or the eager one where it cannot be captured."""
    times = [row[k] for k in ("us_graph", "us_eager") if row.get(k) == row.get(k) and k in row]
    return min(times) if times else NAN


TABLE_COLUMNS = [
    "fused_w4a16",
    "fused_w4a16_gemv",
    "fused_w4a16_tile",
    "seq_w4a16",
    "dequant_fp16",
    "hf_grouped_mm",
    "hf_batched_mm",
    "grouped_fp16",
    "roofline_int4",
    "roofline_fp16",
]


def print_table(shape: ModelShape, summary: dict, tokens: list[int], grouped_tokens: list[int]):
    """Per-layer times (us); '*' marks an eager time (the path could not be graph-captured)."""
    log(f"\n{shape.name}: us per MoE layer (CUDA graph medians; * = eager)")
    log("T    " + "".join(f"{c[:16]:>17s}" for c in TABLE_COLUMNS) + "  hf/fused fused/roof")
    for T in tokens:
        cells, vals = [], {}
        for c in TABLE_COLUMNS:
            row = summary.get((T, c), {})
            vals[c] = best_us(row)
            star = "*" if "us_graph" not in row or row["us_graph"] != row["us_graph"] else " "
            cells.append(f"{vals[c]:16.1f}{star}")
        hf = min(vals["hf_grouped_mm"], vals["hf_batched_mm"])
        fused = vals["fused_w4a16"]
        log(
            f"{T:<4d} "
            + "".join(cells)
            + f"  {hf / fused:8.2f} {fused / vals['roofline_int4']:10.2f}"
        )
    log(f"{shape.name}: grouped FP16 vs the faster transformers path")
    for T in grouped_tokens:
        ours = best_us(summary.get((T, "grouped_fp16"), {}))
        hf = min(best_us(summary.get((T, p), {})) for p in ("hf_grouped_mm", "hf_batched_mm"))
        verdict = "met" if ours <= hf else "MISSED"
        ratio = hf / ours
        log(f"  T={T:<3d} grouped_fp16 {ours:8.1f}  hf {hf:9.1f}  hf/ours {ratio:5.2f} {verdict}")


def run_sweeps(rec: Recorder, models: list[ModelShape], t0: float) -> None:
    for shape in models:
        sweep(rec, shape, [1, 2, 4, 8, 16, 32] if shape.experts > 16 else [1, 8])
    log(f"sweep done at {time.perf_counter() - t0:.0f} s")


def git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        return "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."), help="output folder")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated model names")
    parser.add_argument("--tokens", default="1,2,4,8,16,32")
    parser.add_argument(
        "--grouped-tokens", default="9-33", help="range for the grouped FP16 comparison"
    )
    parser.add_argument("--sweep", action="store_true", help="run the tile-shape sweep first")
    parser.add_argument("--sweep-only", action="store_true")
    parser.add_argument("--no-prefill", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        log("bench_kernels needs a CUDA GPU")
        return 2
    import transformers
    import triton

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokens = [int(t) for t in args.tokens.split(",") if t]
    lo, _, hi = args.grouped_tokens.partition("-")
    grouped_tokens = list(range(int(lo), int(hi or lo) + 1)) if lo else []
    bandwidth = copy_bandwidth()
    meta = {
        "bench": "kernels",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "gpu": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "transformers": transformers.__version__,
        "weights": "random normal * 0.02, fp16; INT4 = symmetric RTN group 128 of the same weights",
        "timing": f"CUDA graph of 8 calls rotating {NUM_SETS} weight sets x {NUM_SETS} input sets, "
        "median over replays; us_eager: same without a graph",
        "measured_copy_bandwidth_tbs": round(bandwidth / 1e12, 3),
        "roofline_bandwidth_tbs": COPY_BANDWIDTH / 1e12,
    }
    log(
        f"{meta['gpu']} torch {meta['torch']} triton {meta['triton']} transformers "
        f"{meta['transformers']}; copy bandwidth {bandwidth / 1e12:.2f} TB/s"
    )
    rec = Recorder(out_dir, meta)
    models = [MODELS[m] for m in args.models.split(",") if m]
    t0 = time.perf_counter()
    if args.sweep_only:
        run_sweeps(rec, models, t0)
        return 0
    summaries = {}
    for shape in models:
        summaries[shape.name] = bench_model(rec, shape, tokens, grouped_tokens)
        if not args.no_prefill and shape.name == "deepseek-v2-lite":
            for T in (512, 4096):
                prefill_check(rec, shape, T)
        log(f"  elapsed {time.perf_counter() - t0:.0f} s")
    for shape in models:
        print_table(shape, summaries[shape.name], tokens, grouped_tokens)
    if args.sweep:  # after the benchmark, so a crash here cannot lose its records
        run_sweeps(rec, [m for m in models if m.name != "qwen1.5-moe"], t0)
    log(f"copy bandwidth at the end: {copy_bandwidth() / 1e12:.2f} TB/s")
    errors = [r for r in rec.rows if "error" in r]
    bad = [r for r in rec.rows if r.get("rel_err", 0) > 2e-2 and "prefill" not in r["path"]]
    log(
        f"\n{len(rec.rows)} records, {len(errors)} errors, {len(bad)} over 2e-2 error; "
        f"{time.perf_counter() - t0:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
