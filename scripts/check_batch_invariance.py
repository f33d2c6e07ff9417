"""GPU diagnostic: are rows bit-identical across row counts, with and without BatchInvariantMode?

Usage: python3 scripts/check_batch_invariance.py --out FILE.jsonl   (one CUDA GPU)

For each op at DeepSeek-V2-Lite-like shapes (hidden 2048, vocab 102400, 16 heads
with qk dim 192 / v dim 128, 64 experts of intermediate 1408, top-6) the op runs
on 33 rows, then on the first M rows for M in {1, 2, 3, 5, 9, 17, 33}; a row
count "matches" when its rows equal the 33-row result bit for bit. Then times
invariant_mm against F.linear (cuBLAS) at M = 1, 8, 33 (median of CUDA-event
timings). Prints a table and writes one JSON object per line to --out.

    source scripts/offline-env.sh && python3 scripts/check_batch_invariance.py --out $OUT/bi.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

import specter_kernels as sk

ROW_COUNTS = (1, 2, 3, 5, 9, 17, 33)
H, VOCAB, HEADS, QK_DIM, V_DIM = 2048, 102400, 16, 192, 128
INTER, E, TOP_K = 1408, 64, 6  # expert intermediate size, experts, experts per token
CACHE_LEN, START = 1024, 200  # static cache slots; position of the first query


def _ops(device: torch.device) -> dict:
    """name -> (fn(rows) -> tensor with rows on dim `row_dim`, input rows [33, ...], row_dim)."""
    g = torch.Generator(device=device).manual_seed(0)

    def randn(*shape, dtype=torch.float16, scale=1.0):
        return (torch.randn(*shape, generator=g, device=device) * scale).to(dtype)

    M = max(ROW_COUNTS)
    x = randn(M, H)
    w_q = randn(HEADS * QK_DIM, H, scale=0.02)
    w_o = randn(H, H, scale=0.02)
    w_head = randn(VOCAB, H, scale=0.02)
    w_router = randn(E, H, dtype=torch.float32, scale=0.02)
    w_gate_up = randn(2 * INTER, H, scale=0.02)
    norm_w = randn(H)
    logits = randn(M, VOCAB, dtype=torch.float32)
    q = randn(1, HEADS, M, QK_DIM)
    k = randn(1, HEADS, CACHE_LEN, QK_DIM)
    v = randn(1, HEADS, CACHE_LEN, V_DIM)
    positions = torch.arange(START, START + M, device=device)
    visible = torch.arange(CACHE_LEN, device=device)[None, :] <= positions[:, None]
    ids = torch.topk(torch.randn(M, E, generator=g, device=device), TOP_K).indices
    weights = torch.rand(M, TOP_K, generator=g, device=device)
    w13 = randn(E, 2 * INTER, H, scale=0.02)
    w2 = randn(E, H, INTER, scale=0.02)
    slot_of = torch.arange(E, device=device, dtype=torch.int32)
    resident = torch.rand(E, generator=g, device=device) < 0.5

    def grouped(rows, per_pair):
        m = rows.shape[0]
        shape = (m, TOP_K, H) if per_pair else (m, H)
        out = torch.zeros(shape, device=device)
        args = (rows, ids[:m], weights[:m], w13, w2, slot_of)
        sk.grouped_moe_fp16(*args, resident, out)
        sk.grouped_moe_fp16(*args, ~resident, out)
        return sk.sum_routed_pairs(out) if per_pair else out

    return {
        "F.linear q_proj 2048->3072": (lambda r: F.linear(r, w_q), x, 0),
        "F.linear o_proj 2048->2048": (lambda r: F.linear(r, w_o), x, 0),
        "F.linear lm_head 2048->102400": (lambda r: F.linear(r, w_head), x, 0),
        "F.linear router fp32 2048->64": (lambda r: F.linear(r.float(), w_router), x, 0),
        "matmul gate_up 2048->2816": (lambda r: r @ w_gate_up.T, x, 0),
        "F.rms_norm 2048": (lambda r: F.rms_norm(r, (H,), norm_w, 1e-6), x, 0),
        "pow(2).mean(-1) 2048": (lambda r: r.float().pow(2).mean(-1, keepdim=True), x, 0),
        "softmax fp32 102400": (lambda r: torch.softmax(r, -1), logits, 0),
        "log_softmax fp32 102400": (lambda r: F.log_softmax(r, -1), logits, 0),
        "sdpa static cache 16x192/128": (
            lambda r: F.scaled_dot_product_attention(
                r, k, v, attn_mask=visible[: r.shape[2]][None, None]
            ),
            q,
            2,
        ),
        "sdpa is_causal prefill": (
            lambda r: F.scaled_dot_product_attention(
                r, k[:, :, : r.shape[2]], v[:, :, : r.shape[2]], is_causal=True
            ),
            q,
            2,
        ),
        "grouped_fp16 [T,H] atomics": (lambda r: grouped(r, False), x, 0),
        "grouped_fp16 [T,k,H] per-pair": (lambda r: grouped(r, True), x, 0),
    }


def check(fn, rows: torch.Tensor, row_dim: int) -> dict:
    """Which row counts give rows bit-identical to the full run, and the largest difference."""
    full = fn(rows)
    mismatched, max_diff = [], 0.0
    for m in ROW_COUNTS:
        part = fn(rows.narrow(row_dim, 0, m))
        ref = full.narrow(row_dim, 0, m)
        if not torch.equal(part, ref):
            mismatched.append(m)
            max_diff = max(max_diff, float((part.float() - ref.float()).abs().max()))
    return {
        "invariant": not mismatched,
        "mismatched_row_counts": mismatched,
        "max_abs_diff": max_diff,
    }


def median_ms(fn, reps: int = 50) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="batch_invariance.jsonl", help="JSON lines output")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA device")
    device = torch.device("cuda")
    began = time.perf_counter()
    records = []
    print(f"{'op':36s} {'mode':5s} {'invariant':9s} mismatched M (max |diff|)")
    for name, (fn, rows, row_dim) in _ops(device).items():
        for mode in (False, True):
            with torch.no_grad():
                if mode:
                    with sk.batch_invariant():
                        result = check(fn, rows, row_dim)
                else:
                    result = check(fn, rows, row_dim)
            record = {"kind": "invariance", "op": name, "mode": mode, **result}
            records.append(record)
            detail = f"{result['mismatched_row_counts']} ({result['max_abs_diff']:.3g})"
            print(f"{name:36s} {'on' if mode else 'off':5s} {result['invariant']!s:9s} {detail}")
    print(f"\n{'linear N x K':22s} {'M':>3s} {'invariant_mm ms':>16s} {'F.linear ms':>12s} ratio")
    g = torch.Generator(device=device).manual_seed(1)
    for N, K in ((2048, 2048), (3072, 2048), (2816, 2048), (2048, 1408), (102400, 2048)):
        w = (torch.randn(N, K, generator=g, device=device) * 0.02).half()
        for M in (1, 8, 33):
            x = torch.randn(M, K, generator=g, device=device).half()
            ours = median_ms(lambda x=x, w=w: sk.invariant_mm(x, w.T))
            cublas = median_ms(lambda x=x, w=w: F.linear(x, w))
            record = {"kind": "timing", "N": N, "K": K, "M": M, "invariant_mm_ms": ours,
                      "f_linear_ms": cublas, "ratio": ours / cublas}  # fmt: skip
            records.append(record)
            print(f"{N:>7d} x {K:<12d} {M:>3d} {ours:16.4f} {cublas:12.4f} {ours / cublas:5.2f}")
    seconds = time.perf_counter() - began
    device_name = torch.cuda.get_device_name()
    records.append({"kind": "meta", "device": device_name, "torch": torch.__version__,
                    "seconds": seconds})  # fmt: skip
    with open(args.out, "w") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")
    print(f"\n{len(records)} records -> {args.out} in {time.perf_counter() - began:.1f} s")


if __name__ == "__main__":
    main()
