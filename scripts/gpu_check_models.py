"""GPU check of specter-models on the full-size presets (seeded random weights).

For each model at its low budget (DeepSeek-V2-Lite 16 GB, Qwen1.5-MoE 14 GB, Phi-3.5-MoE
32 GB) this script:

1. builds the model with ``specter_models.load`` (experts generated on the GPU one at a time
   into pinned host memory, INT4 draft quantized on the way) and records build time and
   memory;
2. generates N greedy tokens with ``SpecController`` at depth K (draft + prefetcher) and
   with the same engine's plain target decoding (K = 0) and asserts the tokens are equal;
3. teacher-forces prompt + those tokens through the target and through transformers' own
   model holding every weight on the GPU (same weights: ``reference_model_from``), and
   reports the max absolute and relative logit error and the argmax agreement where the
   reference's top-2 margin exceeds twice the max absolute error;
4. reports TPOT (speculative and plain), acceptance, cache hit rate, prefetch statistics and
   peak GPU memory during decoding.

One JSON line per model goes to ``$OUT/models-gpu.jsonl`` and a table to
``$OUT/models-gpu-summary.md``. Random weights: acceptance and hit rates are not those of
trained models (see shared/BENCHMARK.md).

    source scripts/gpu-env.sh && python3 scripts/gpu_check_models.py --models deepseek-v2-lite

CPU dry run of the same code on tiny presets (slots instead of a budget):

    .venv/bin/python scripts/gpu_check_models.py --device cpu --models tiny-deepseek-v2 \
        --slots 3 --tokens 16 --out /tmp/check
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

import specter_models
from specter_bench.system_run import first_mismatch
from specter_spec import SpecController

# Rough wall-clock need per model (build, warm-up, decoding, reference), to skip what would
# not finish before the deadline instead of being killed half-way.
ESTIMATED_SECONDS = {"deepseek-v2-lite": 70, "qwen1.5-moe": 70, "phi-3.5-moe": 130}
# Random-weight Phi-3.5-MoE has greedy draft/target agreement 0.000 (shared/BENCHMARK.md) and
# one expert slot per layer at 32 GB: deep drafts only multiply its expert loads.
DEFAULT_DEPTH = {"phi-3.5-moe": 2}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="deepseek-v2-lite,qwen1.5-moe,phi-3.5-moe")
    p.add_argument("--tokens", type=int, default=64, help="greedy tokens to generate")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument(
        "--depth", type=int, default=None, help=f"speculation depth K (default 8; {DEFAULT_DEPTH})"
    )
    p.add_argument("--seed", type=int, default=0, help="random-weight seed")
    p.add_argument("--budget-gb", type=float, default=None, help="override the low budgets")
    p.add_argument("--slots", type=int, default=None, help="slots per layer instead of a budget")
    p.add_argument("--device", default="cuda")
    p.add_argument(
        "--batch-invariant",
        choices=("on", "off"),
        default="on",
        help="verify with batch-invariant arithmetic (on: spec must equal plain bit for bit)",
    )
    p.add_argument(
        "--contrast",
        default="",
        help="comma-separated models also decoded (spec and plain) with the other "
        "batch-invariance setting: what invariance costs and buys",
    )
    p.add_argument(
        "--all-resident",
        default="",
        help="comma-separated models also run with every expert resident (no budget)",
    )
    p.add_argument("--deadline-s", type=float, default=float("inf"), help="skip models past it")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    return p.parse_args(argv)


def git_commit() -> str | None:
    """HEAD of the tree, or ``$SPECTER_GIT_COMMIT`` where the copy has no ``.git``."""
    if os.environ.get("SPECTER_GIT_COMMIT"):
        return os.environ["SPECTER_GIT_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def release_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        # Pinned host blocks are cached by torch's host allocator: give them back too.
        if hasattr(torch._C, "_host_emptyCache"):
            torch._C._host_emptyCache()


class RoutingCapture:
    """Forward hooks on a model's routers recording each MoE layer's top-k ids and weights.

    transformers' three routers (DeepSeek's and Qwen's ``mlp.gate``, Phi's ``mlp.router``)
    return ``(logits, weights [T, k], ids [T, k])``; Specter keeps these modules. Phi's
    sparsemixer can also flip a routing weight discretely without changing the ids (a logit
    crossing its masking threshold), so weights are compared too.
    """

    # A discrete flip changes a weight by tenths; fp16 rounding by thousandths.
    WEIGHT_TOLERANCE = 0.02

    def __init__(self, model: torch.nn.Module):
        self.ids: list[torch.Tensor] = []
        self.weights: list[torch.Tensor] = []
        self._hooks = []
        for layer in model.model.layers:
            router = getattr(layer.mlp, "router", None) or getattr(layer.mlp, "gate", None)
            if router is None or not hasattr(layer.mlp, "experts"):
                continue
            self._hooks.append(router.register_forward_hook(self._record))

    def _record(self, module, inputs, output) -> None:
        ids, order = output[-1].detach().sort(dim=-1)
        self.ids.append(ids)
        self.weights.append(output[-2].detach().float().gather(-1, order))

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()

    def rows_equal(self, other: RoutingCapture) -> torch.Tensor:
        """Bool ``[T]``: rows routed alike (same experts, weights within rounding) in every
        layer by both models."""
        same = None
        for a, b, wa, wb in zip(self.ids, other.ids, self.weights, other.weights, strict=True):
            close = (wa - wb).abs() <= self.WEIGHT_TOLERANCE * (1 + wb.abs())
            row = ((a == b) & close).all(dim=-1)
            same = row if same is None else same & row
        return same


def compare_logits(
    got: torch.Tensor, ref: torch.Tensor, same_routing: torch.Tensor
) -> dict[str, float | int | None]:
    """Logit errors and argmax agreement, separating rows whose routing diverged.

    Random weights give near-tie routers: a rounding difference can send a row to another
    expert on one side only, which changes that row (and, through attention, later rows)
    by far more than fp16 rounding. Errors are reported over all rows and over the clean
    prefix (every row up to the first routing divergence). The tolerance for the argmax
    check is the clean prefix's max abs error (or the overall one when the first row
    diverges); rows count as clear when the reference's top-2 margin exceeds twice it.
    """
    got, ref = got.float(), ref.float()
    row_err = (got - ref).abs().amax(dim=-1)
    scale = ref.abs().max().item()
    diverged = (~same_routing).nonzero()
    clean = int(diverged[0, 0]) if diverged.numel() else row_err.numel()
    max_abs = row_err.max().item()
    clean_abs = row_err[:clean].max().item() if clean else None
    tolerance = clean_abs if clean_abs is not None else max_abs
    top2 = ref.topk(2, dim=-1).values
    clear = (top2[..., 0] - top2[..., 1]) > 2 * tolerance
    agree = got.argmax(-1) == ref.argmax(-1)
    return {
        "max_abs_err": max_abs,
        "max_rel_err": max_abs / scale if scale else None,
        "median_row_abs_err": row_err.median().item(),
        "ref_max_abs_logit": scale,
        "rows": int(agree.numel()),
        "rows_same_routing": int(same_routing.sum().item()),
        "clean_prefix_rows": clean,
        "clean_prefix_max_abs_err": clean_abs,
        "clean_prefix_max_rel_err": clean_abs / scale if clean_abs is not None and scale else None,
        "argmax_tolerance": tolerance,
        "argmax_agree_all": int(agree.sum().item()),
        "rows_clear_margin": int(clear.sum().item()),
        "argmax_agree_clear": int((agree & clear).sum().item()),
    }


def run_model(
    name: str, args: argparse.Namespace, device: torch.device, all_resident: bool = False
) -> dict:
    record: dict = {"model": name, "seed": args.seed, "weights": f"random seed={args.seed}"}
    depth = args.depth if args.depth is not None else DEFAULT_DEPTH.get(name, 8)
    preset = specter_models.get_preset(name)
    budget = args.budget_gb if args.budget_gb is not None else preset.low_budget_gb
    if args.slots is not None or all_resident:
        budget = None
    record["all_resident"] = all_resident
    record["budget_gb"] = budget
    t0 = time.perf_counter()
    lm = specter_models.load(
        name,
        gpu_memory_gb=budget,
        device=device,
        dtype=torch.float16,
        seed=args.seed,
        max_seq_len=args.prompt_len + args.tokens + depth + 8,
        slots_per_layer=args.slots if not all_resident else None,
        batch_invariant=args.batch_invariant == "on",
    )
    record["batch_invariant"] = lm.batch_invariant
    synchronize(device)
    record["build_s"] = time.perf_counter() - t0
    record["memory"] = lm.memory.as_dict()
    record["slots_per_layer"] = lm.memory.plan.slots_per_layer
    record["num_experts"] = lm.memory.plan.num_experts
    print(f"[{name}] built in {record['build_s']:.1f} s: {lm}", flush=True)
    print(lm.memory.plan.describe(), flush=True)

    generator = torch.Generator().manual_seed(1234)
    prompt = torch.randint(0, lm.config.vocab_size, (args.prompt_len,), generator=generator)
    prompt = prompt.tolist()

    # Warm-up: compiles the Triton kernels of both paths (excluded from the timings).
    t = time.perf_counter()
    lm.controller(depth=min(depth, 4)).generate(prompt[:8], max_new_tokens=6)
    synchronize(device)
    record["warmup_s"] = time.perf_counter() - t

    # Speculative decoding.
    lm.reset()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    spec = SpecController(lm.draft, lm.target, cache=lm.prefetcher, depth=depth)
    result = spec.generate(prompt, max_new_tokens=args.tokens)
    synchronize(device)
    stats = result.stats
    cache_stats = lm.cache.stats()["total"]
    prefetch = lm.prefetcher.stats()
    record["spec"] = {
        "depth": depth,
        "tpot_ms": stats.tpot_s * 1e3,
        "prefill_s": stats.prefill_time_s,
        "acceptance_rate": stats.acceptance_rate,
        "mean_accepted_per_iteration": stats.mean_accepted_per_iteration,
        "iterations": stats.num_iterations,
        "draft_time_s": stats.draft_time_s,
        "verify_time_s": stats.verify_time_s,
        "cache_hit_rate": cache_stats["hit_rate"],
        "cache": {k: v for k, v in cache_stats.items() if not isinstance(v, dict | list)},
        "plan_precision": prefetch["plan_precision"],
        "plan_recall": prefetch["plan_recall"],
        "peak_gpu_bytes": torch.cuda.max_memory_allocated(device)
        if device.type == "cuda"
        else None,
    }
    print(f"[{name}] spec: {json.dumps(record['spec'], default=str)}", flush=True)

    # The same engine without speculation.
    lm.reset()
    plain = SpecController(None, lm.target, depth=0).generate(prompt, max_new_tokens=args.tokens)
    synchronize(device)
    record["plain"] = {
        "tpot_ms": plain.stats.tpot_s * 1e3,
        "cache_hit_rate": lm.cache.stats()["total"]["hit_rate"],
    }
    record["tokens_equal"] = result.tokens == plain.tokens
    record["tokens"] = result.tokens
    if not record["tokens_equal"]:
        record["first_mismatch"] = first_mismatch(result.tokens, plain.tokens)
    print(f"[{name}] plain: {record['plain']}, tokens equal: {record['tokens_equal']}", flush=True)

    if name in args.contrast.split(",") and not all_resident:
        # The other batch-invariance setting, same prompt: what invariance costs and buys.
        lm.batch_invariant = not lm.batch_invariant
        lm.reset()
        other = SpecController(lm.draft, lm.target, cache=lm.prefetcher, depth=depth).generate(
            prompt, max_new_tokens=args.tokens
        )
        lm.reset()
        other_plain = SpecController(None, lm.target, depth=0).generate(
            prompt, max_new_tokens=args.tokens
        )
        synchronize(device)
        record["contrast"] = {
            "batch_invariant": lm.batch_invariant,
            "spec_tpot_ms": other.stats.tpot_s * 1e3,
            "plain_tpot_ms": other_plain.stats.tpot_s * 1e3,
            "acceptance_rate": other.stats.acceptance_rate,
            "spec_equals_plain": other.tokens == other_plain.tokens,
            "first_mismatch": first_mismatch(other.tokens, other_plain.tokens),
        }
        lm.batch_invariant = not lm.batch_invariant
        print(f"[{name}] contrast: {record['contrast']}", flush=True)

    # Teacher forcing through the target and through transformers with every weight resident.
    sequence = torch.tensor([prompt + result.tokens], device=device)
    rows = slice(args.prompt_len - 1, None)  # the rows predicting the generated tokens
    lm.reset()
    target_routing = RoutingCapture(lm.model)
    target_logits = lm.target.forward(sequence[:, :-1], 0)[0, rows].float()
    target_routing.close()
    lm.reset()
    t = time.perf_counter()
    reference = specter_models.reference_model_from(lm)
    synchronize(device)
    record["reference_build_s"] = time.perf_counter() - t
    record["reference_experts_implementation"] = reference.config._experts_implementation
    reference_routing = RoutingCapture(reference)
    with torch.no_grad():
        ref_logits = reference(sequence[:, :-1]).logits[0, rows].float()
    reference_routing.close()
    same = target_routing.rows_equal(reference_routing)[rows]
    record["teacher_forced"] = compare_logits(target_logits, ref_logits, same)
    print(f"[{name}] teacher-forced: {record['teacher_forced']}", flush=True)
    return record  # every model, cache and store of this run is released with the frame


def summary_table(records: list[dict]) -> str:
    head = (
        "| model | budget GB | slots/layer | build s | spec TPOT ms | plain TPOT ms | acceptance "
        "| hit rate (spec) | tokens equal | max abs err (rel) | clean-prefix rows, max abs err "
        "| argmax agree (clear margin) | peak GPU GB | batch-invariant |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    )
    rows = [head]
    for r in records:
        if "error" in r or "skipped" in r:
            rows.append(f"| {r['model']} | {r.get('skipped') or 'error: ' + r['error']} |")
            continue
        s, tf = r["spec"], r["teacher_forced"]
        peak = s["peak_gpu_bytes"]
        clean_err = tf["clean_prefix_max_abs_err"]
        clean_err = float("nan") if clean_err is None else clean_err
        name = r["model"] + (" (all resident)" if r.get("all_resident") else "")
        rows.append(
            f"| {name} | {r['budget_gb']} | {r['slots_per_layer']}/{r['num_experts']} "
            f"| {r['build_s']:.1f} | {s['tpot_ms']:.1f} | {r['plain']['tpot_ms']:.1f} "
            f"| {s['acceptance_rate']:.3f} | {_fmt(s['cache_hit_rate'])} | {r['tokens_equal']} "
            f"| {tf['max_abs_err']:.4f} ({tf['max_rel_err']:.4f}) "
            f"| {tf['clean_prefix_rows']}/{tf['rows']}, {clean_err:.4f} "
            f"| {tf['argmax_agree_clear']}/{tf['rows_clear_margin']} "
            f"(all rows {tf['argmax_agree_all']}/{tf['rows']}) "
            f"| {peak / 1e9 if peak else float('nan'):.2f} | {r.get('batch_invariant')} |"
        )
    return "\n".join(rows)


def _fmt(value: float | None) -> str:
    """Three decimals, or "n/a" (an all-resident run counts no cache lookups)."""
    return "n/a" if value is None else f"{value:.3f}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.perf_counter()
    device = torch.device(args.device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    identity = {
        "git_commit": git_commit(),
        "gpu": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor(),
        "torch": torch.__version__,
        "transformers": __import__("transformers").__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
    }
    records = []
    failed = False
    runs = [(m.strip(), False) for m in args.models.split(",") if m.strip()]
    runs += [(m.strip(), True) for m in args.all_resident.split(",") if m.strip()]
    for name, all_resident in runs:
        elapsed = time.perf_counter() - started
        if elapsed + ESTIMATED_SECONDS.get(name, 30) > args.deadline_s:
            record = {
                "model": name,
                "skipped": f"not started: {elapsed:.0f} s elapsed of the deadline",
            }
        else:
            try:
                record = run_model(name, args, device, all_resident)
                failed |= not record["tokens_equal"]
            except Exception as exc:  # record the failure, go on with the next model
                traceback.print_exc()
                record = {"model": name, "error": f"{type(exc).__name__}: {exc}"}
                failed = True
            release_memory()  # the last model's GPU memory and pinned host blocks
        record.update(identity)
        records.append(record)
        with (out / "models-gpu.jsonl").open("a") as f:
            f.write(json.dumps(record, default=str) + "\n")
    table = summary_table(records)
    (out / "models-gpu-summary.md").write_text(table + "\n")
    print(table, flush=True)
    print(f"total {time.perf_counter() - started:.1f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
