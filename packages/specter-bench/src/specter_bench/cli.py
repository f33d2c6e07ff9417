"""The ``specter`` command line: one subcommand per module of :mod:`specter_bench.commands`.

``specter`` with no command is ``specter generate``: the built-in demo model
``specter-code-tiny`` completes a code prompt, on the GPU when there is one and on the CPU
otherwise, streaming the text and printing statistics.

Every command checks its arguments before loading anything; a bad value is reported with
what was expected (exit status 2). Long work shows tqdm progress bars on stderr.
"""

from __future__ import annotations

import argparse
import difflib
import re
import shlex
import sys
from collections.abc import Sequence

from specter_bench.commands import (
    bench,
    generate,
    info,
    kernel_bench,
    llama_cpp,
    policy_replay,
    profile_depth,
    record_routing,
    report,
    serve,
    step_trace,
    train,
    tune,
    write_checkpoint,
)
from specter_bench.commands.args import (
    CommandError,
    parse_budget,
    parse_depth,
    parse_int_list,
    resolve_device,
)

__all__ = [
    "CommandError",
    "build_parser",
    "main",
    "parse_budget",
    "parse_depth",
    "parse_int_list",
    "resolve_device",
]

COMMAND_MODULES = (
    generate,
    bench,
    profile_depth,
    kernel_bench,
    info,
    report,
    serve,
    train,
    step_trace,
    record_routing,
    policy_replay,
    tune,
    write_checkpoint,
    llama_cpp,
)
"""The modules whose ``register`` adds a subcommand, in the order ``--help`` lists them."""


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line and a hint, not the usage block."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n(see {self.prog} --help)\n")


_COMMAND_LIKE = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
"""A first argument of this shape that is no command is a mistyped command, not a prompt."""


def unknown_command(word: str, commands: Sequence[str]) -> str | None:
    """The error for a first argument that looks like a command but is none, else None.

    A one-word prompt is still given as ``specter generate WORD``.
    """
    if word in commands or not _COMMAND_LIKE.fullmatch(word):
        return None
    close = difflib.get_close_matches(word, commands, n=1, cutoff=0.6)
    hint = f"did you mean {close[0]}? " if close else f"commands: {', '.join(commands)}. "
    return (
        f"specter: error: unknown command {word!r}: {hint}"
        f"(a one-word prompt is given as: specter generate {word})"
    )


def build_parser() -> argparse.ArgumentParser:
    """The ``specter`` argument parser with one subparser per command."""
    parser = _Parser(
        prog="specter",
        description="Fast Mixture-of-Experts decoding on one GPU with offloaded experts: "
        "speculative decoding with a shared-weight INT4 draft and draft-guided prefetch.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``specter`` command line; returns the exit status.

    Args:
        argv: arguments without the program name (default ``sys.argv[1:]``).
    """
    args_list = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    commands = next(
        action.choices
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    if args_list and (mistyped := unknown_command(args_list[0], list(commands))):
        print(mistyped, file=sys.stderr)
        return 2
    if not args_list or args_list[0] not in (*commands, "-h", "--help"):
        args_list.insert(0, "generate")  # `specter` alone, or `specter "prompt"`
    try:
        args = parser.parse_args(args_list)
    except SystemExit as exc:  # argparse already printed the error
        return int(exc.code or 0)
    args.invocation = "specter " + shlex.join(args_list)  # recorded with results
    try:
        return args.run(args)
    except (CommandError, ValueError, TypeError, FileNotFoundError, KeyError, ImportError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"specter {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"specter {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
