"""``specter step-trace``: each kernel of one plain decode step in launch order, with its
median time and the idle gap before it, beside the step's wall, kernel-busy and copy time.

    specter step-trace --model qwen1.5-moe --gpu-memory-gb 14 --out /tmp/step-trace.jsonl
    specter step-trace --model deepseek-v2-lite --gpu-memory-gb 24 --batch 4

Needs a CUDA GPU (its arguments are checked first, everywhere).
"""

from __future__ import annotations

import argparse
import json

__all__ = ["config_from_args", "register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds ``step-trace`` to the ``specter`` parser."""
    from specter_bench.commands.args import parse_budget, positive_int

    p = subparsers.add_parser(
        "step-trace",
        help="kernel sequence of one plain decode step, with times and idle gaps (CUDA)",
        description="Profile plain (draft-free) decode steps of a model under a memory budget "
        "(the streamed miss path with fills) or with every expert resident: per token, the "
        "wall time, kernel-busy and copy-busy time, the kernels and runtime calls with the "
        "most time, and one token's kernels in launch order with their median duration and "
        "the idle gap before each.",
    )
    p.add_argument("--model", default="qwen1.5-moe", help="preset or checkpoint folder")
    p.add_argument(
        "--gpu-memory-gb",
        type=parse_budget,
        default=14.0,
        help="expert budget in GB, or unlimited (every expert resident; default 14)",
    )
    p.add_argument("--tokens", type=positive_int, default=64, help="timed decode (64)")
    p.add_argument("--profiled", type=positive_int, default=16, help="profiled tokens (16)")
    p.add_argument("--fills", type=positive_int, default=8, help="streamed-miss fills (8)")
    p.add_argument("--top", type=positive_int, default=14, help="kernels listed by time (14)")
    p.add_argument(
        "--no-pipelined",
        action="store_true",
        help="count each step before the next launches (default: pipelined records, as "
        "`specter generate` decodes)",
    )
    p.add_argument(
        "--batch",
        type=positive_int,
        default=None,
        help="trace the steps of B sequences decoded together without a draft (the "
        "--max-batch path of generate and serve; default: single-sequence steps)",
    )
    p.add_argument("--device", default="cuda", help="a CUDA device (default cuda)")
    p.add_argument("--out", default=None, help="append the result as one JSON line here")
    p.set_defaults(run=run)


def config_from_args(args: argparse.Namespace):
    """The `StepTraceConfig` the parsed flags ask for."""
    from specter_bench.step_trace import StepTraceConfig

    return StepTraceConfig(
        model=args.model,
        gpu_memory_gb=args.gpu_memory_gb,
        tokens=args.tokens,
        profiled=args.profiled,
        fills=args.fills,
        top=args.top,
        pipelined=not args.no_pipelined,
        device=args.device,
        batch=args.batch or 0,
    )


def run(args: argparse.Namespace) -> int:
    """Traces, prints the report and appends the JSON line to ``--out``."""
    from specter_bench.step_trace import format_step_trace, trace_plain_step

    result = trace_plain_step(config_from_args(args))
    if getattr(args, "invocation", None):
        result["command"] = args.invocation
    print(format_step_trace(result))
    if args.out:
        with open(args.out, "a", encoding="utf-8") as f:
            f.write(json.dumps(result) + "\n")
        print(f"wrote {args.out}")
    return 0
