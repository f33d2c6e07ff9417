"""``specter kernel-bench``: the fused INT4 draft kernel against per-expert INT4 and FP16."""

from __future__ import annotations

import argparse
import sys

from specter_bench.commands.args import parse_int_list, positive_int, resolve_device

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``specter kernel-bench``."""
    kb = subparsers.add_parser(
        "kernel-bench",
        help="time the fused INT4 draft kernel against per-expert INT4 and FP16 paths",
        description="One MoE layer of a model's routed-expert shape through three paths.",
    )
    kb.add_argument("--model", default="deepseek-v2-lite", help="preset whose shape to use")
    kb.add_argument("--device", default="auto")
    kb.add_argument("--tokens", type=parse_int_list, default=[1, 2, 4, 8, 16, 32])
    kb.add_argument("--repeats", type=positive_int, default=20)
    kb.add_argument("--out", default=None, help="folder for kernel-<model>.jsonl")
    kb.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Time the three paths at each token count, print a table; exit status 0."""
    from tqdm import tqdm

    from specter_bench.bench_record import ExperimentRecord, append_records
    from specter_bench.kernel_bench import kernel_shape_of, run_kernel_bench
    from specter_bench.run_identity import collect_identity
    from specter_bench.tables import markdown_table
    from specter_models.engine.model_source import model_config

    device = resolve_device(args.device)
    shape = kernel_shape_of(args.model, model_config(args.model))
    bar = tqdm(total=3 * len(args.tokens), desc="kernel-bench", unit="case", file=sys.stderr)

    def step(label: str) -> None:
        bar.set_postfix_str(label)
        bar.update(1)

    timings = run_kernel_bench(
        shape, args.tokens, device=device, repeats=args.repeats, progress=step
    )
    bar.close()
    rows = [[t.tokens, t.path, t.median_ms, f"{t.relative_error:.1e}"] for t in timings]
    print(
        f"{shape.name}: H={shape.hidden} I={shape.intermediate} E={shape.num_experts} "
        f"k={shape.top_k} group={shape.group_size} backend={timings[0].backend} on {device}"
    )
    print(markdown_table(["T", "path", "median ms", "rel. error"], rows))
    if args.out:
        from pathlib import Path

        identity = collect_identity(weights="random (kernel-bench)", device=device)
        identity["command"] = args.invocation
        path = Path(args.out) / f"kernel-{shape.name}.jsonl"
        record = ExperimentRecord(
            "kernel",
            args.model,
            None,
            {"shape": shape.__dict__, "timings": [t.as_dict() for t in timings]},
            identity,
        )
        append_records(path, [record])
        print(f"wrote {path}")
    return 0
