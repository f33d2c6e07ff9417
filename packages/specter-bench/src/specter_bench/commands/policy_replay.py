"""``specter policy-replay``: replay recorded routing through expert-cache policies on the
CPU and report each policy's loads per decoded token against Belady's fewest.

    specter policy-replay routing.pt --slots 39 --hot 36
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specter_bench.commands.args import non_negative_int

__all__ = ["config_from_args", "register", "run"]


def _index_list(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        values = ()
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated prompt indices >= 0 such as 3,4,5, got {text!r}"
        )
    return values


def _calibration(text: str) -> tuple[int, ...] | None:
    return None if text == "loo" else _index_list(text)


def _unit_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a decay in (0, 1], got {text!r}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0.0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    """Adds ``policy-replay`` to the ``specter`` parser."""
    p = subparsers.add_parser(
        "policy-replay",
        help="replay recorded routing through cache policies; loads per token vs Belady",
        description="Count, per measured prompt of a `specter record-routing` dump, the expert "
        "loads of its decode under each cache policy at one slot count per layer, every "
        "policy starting from the state the prompt's prefill leaves: pinned-calib (the "
        "bench's hot set plus LRU), pinned-prompt (a hot set chosen from the prompt), lfu "
        "(decayed counts), draft-lookahead (the draft's routing names the victims) and belady "
        "(the fewest loads).",
    )
    p.add_argument("dump", help="a routing dump from `specter record-routing`")
    p.add_argument("--slots", type=non_negative_int, default=39, help="slots a layer (39)")
    p.add_argument("--hot", type=non_negative_int, default=36, help="pinned a layer (36)")
    p.add_argument(
        "--calibration",
        type=_calibration,
        default=(3, 4, 5, 6, 7, 8, 9, 10),
        help="prompt indices whose decodes count the hot set (default 3,4,...,10: the 8 "
        "after the bench's 3 measured prompts), or loo (every other prompt)",
    )
    p.add_argument(
        "--prompts",
        type=_index_list,
        default=None,
        help="prompt indices to measure (default: every prompt not in --calibration)",
    )
    p.add_argument("--prior", type=_non_negative_float, nargs="*", default=[0.0, 0.5, 1.0, 2.0])
    p.add_argument("--decay", type=_unit_float, nargs="*", default=[1.0, 0.99, 0.95])
    p.add_argument("--horizons", type=non_negative_int, nargs="*", default=[1, 2, 4, 8])
    p.set_defaults(run=run)


def config_from_args(args: argparse.Namespace):
    """The `PolicyReplayConfig` the parsed flags ask for."""
    from specter_bench.policy_replay import PolicyReplayConfig

    return PolicyReplayConfig(
        slots=args.slots,
        hot=args.hot,
        calibration=args.calibration,
        priors=tuple(args.prior),
        decays=tuple(args.decay),
        horizons=tuple(args.horizons),
        prompts=args.prompts,
    )


def run(args: argparse.Namespace) -> int:
    """Loads the dump, replays it, prints one line a prompt and the table."""
    import torch

    from specter_bench.commands.args import CommandError
    from specter_bench.policy_replay import format_policy_replay, replay_policies

    path = Path(args.dump)
    if not path.is_file():
        raise CommandError(
            f"routing dump {path} does not exist; write one with `specter record-routing`."
        )
    config = config_from_args(args)
    dump = torch.load(path, weights_only=True)

    def progress(prompt_id: str, row: dict[str, float]) -> None:
        cells = " ".join(f"{k}:{v:.2f}" for k, v in row.items() if not k.startswith("repin"))
        print(f"{prompt_id}: {cells}", file=sys.stderr, flush=True)

    result = replay_policies(dump, config, progress)
    print(format_policy_replay(result))
    return 0
