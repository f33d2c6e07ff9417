"""``specter record-routing``: dump the target's and the INT4 draft's expert routing of whole
HumanEval sequences, for ``specter policy-replay``.

    specter record-routing --model deepseek-v2-lite --num-prompts 24 --out routing.pt
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["register", "run"]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {text!r}")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds ``record-routing`` to the ``specter`` parser."""
    p = subparsers.add_parser(
        "record-routing",
        help="record the target's and the draft's routing of whole sequences to a file",
        description="Greedy-decode the first HumanEval prompts with every expert resident, "
        "then record the target's and the INT4 draft's expert routing of each whole sequence "
        "(prompt and continuation) by teacher forcing, into a torch.save file.",
    )
    p.add_argument("--model", default="deepseek-v2-lite", help="preset or checkpoint folder")
    p.add_argument("--num-prompts", type=_positive_int, default=24, help="default 24")
    p.add_argument("--max-new-tokens", type=_positive_int, default=64, help="default 64")
    p.add_argument("--no-draft", action="store_true", help="record the target's routing only")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--out", required=True, help="the dump file to write (torch.save)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Records and saves the dump."""
    import torch

    from specter_bench.commands.args import CommandError, resolve_device
    from specter_bench.routing_dump import RoutingDumpConfig, record_routing_dump

    out = Path(args.out)
    if not out.parent.is_dir():
        raise CommandError(f"--out {out}: its folder {out.parent} does not exist; create it first.")
    config = RoutingDumpConfig(
        model=args.model,
        num_prompts=args.num_prompts,
        max_new_tokens=args.max_new_tokens,
        draft=not args.no_draft,
        device=resolve_device(args.device),
    )
    dump = record_routing_dump(config, log=lambda line: print(line, file=sys.stderr, flush=True))
    torch.save(dump, out)
    print(f"wrote {out}")
    return 0
