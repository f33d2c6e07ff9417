"""``specter record-routing``: record a routing trace (the target's and the INT4 draft's
routing, the tokens and the draft's greedy agreement of whole sequences), for
``specter bench --routing replay`` and ``specter policy-replay``.

    specter record-routing --model /tmp/proxy/dsv2-proxy --num-prompts 12 --out dsv2.pt
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specter_bench.commands.args import (
    add_prompt_source_args,
    non_negative_int,
    positive_int,
    prompt_source_config,
)

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds ``record-routing`` to the ``specter`` parser."""
    p = subparsers.add_parser(
        "record-routing",
        help="record a routing trace (target and draft routing, tokens, agreement) to a file",
        description="Greedy-decode the first prompts of a source with every expert resident, "
        "then record the target's and the INT4 draft's expert routing of each whole sequence "
        "(prompt and continuation), its tokens and where the draft's greedy token equals the "
        "target's, by teacher forcing, into a torch.save file: the trace `specter bench "
        "--routing replay` replays on a full-size model of the same topology.",
    )
    p.add_argument("--model", default="deepseek-v2-lite", help="preset or checkpoint folder")
    add_prompt_source_args(p)
    p.add_argument(
        "--max-new-tokens",
        type=positive_int,
        default=128,
        help="new tokens a replay decodes (default 128; --lookahead more are recorded)",
    )
    p.add_argument(
        "--lookahead",
        type=non_negative_int,
        default=16,
        help="tokens recorded past --max-new-tokens: the largest depth a replay verifies "
        "(default 16, the adaptive depth's largest)",
    )
    p.add_argument("--no-draft", action="store_true", help="record the target's routing only")
    p.add_argument(
        "--append",
        action="store_true",
        help="add the sequences to an existing trace of the same model (one trace of several "
        "prompt sources)",
    )
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--out", required=True, help="the trace file to write (torch.save)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Records and saves the trace."""
    from specter_bench.commands.args import CommandError, resolve_device
    from specter_bench.routing_dump import RoutingDumpConfig, record_routing_dump
    from specter_models import RoutingTrace

    out = Path(args.out)
    if not out.parent.is_dir():
        raise CommandError(f"--out {out}: its folder {out.parent} does not exist; create it first.")
    earlier = None
    if args.append:
        if not out.is_file():
            raise CommandError(f"--append: {out} does not exist; record it first without --append.")
        try:
            earlier = RoutingTrace.load(out)
        except ValueError as exc:
            raise CommandError(f"--append: {exc}") from exc
    config = RoutingDumpConfig(
        model=args.model,
        prompts=prompt_source_config(args, default_limit=24),
        max_new_tokens=args.max_new_tokens,
        lookahead=args.lookahead,
        max_prompt_tokens=args.max_prompt_tokens,
        draft=not args.no_draft,
        device=resolve_device(args.device),
    )
    trace = record_routing_dump(config, log=lambda line: print(line, file=sys.stderr, flush=True))
    if earlier is not None:
        same = (earlier.model, earlier.moe_layers, earlier.num_experts, earlier.top_k)
        if same != (trace.model, trace.moe_layers, trace.num_experts, trace.top_k):
            raise CommandError(
                f"--append: {out} holds {earlier.model}'s routing ({same[1]} MoE layers, "
                f"{same[2]} experts, top-{same[3]}); this recording is {trace.model}'s. Write "
                "it to another file."
            )
        if earlier.has_draft != trace.has_draft:
            raise CommandError(
                f"--append: {out} was recorded {'with' if earlier.has_draft else 'without'} "
                "the draft; record this one the same way (--no-draft or not)."
            )
        trace = earlier.extended(trace.sequences)
    trace.save(out)
    print(f"wrote {out}: {len(trace.sequences)} sequences of {trace.model}")
    return 0
