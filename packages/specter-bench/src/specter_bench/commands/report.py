"""``specter report``: result JSON lines to the markdown tables and PNG plots of a page."""

from __future__ import annotations

import argparse

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``specter report``."""
    report = subparsers.add_parser(
        "report",
        help="turn result JSON lines into markdown tables and PNG plots",
        description="Write the results section of a markdown page (default docs/benchmarks.md).",
    )
    report.add_argument("results", nargs="+", help="JSON-lines files from specter bench")
    report.add_argument("--markdown", default="docs/benchmarks.md")
    report.add_argument("--plots-dir", default=None, help="default: <markdown folder>/img")
    report.add_argument(
        "--list-command",
        dest="commands",
        action="append",
        default=[],
        help="a command to list in the report (repeatable)",
    )
    report.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Write the report; exit status 0."""
    from specter_bench.report import write_report

    path = write_report(args.results, args.markdown, args.plots_dir, commands=args.commands)
    print(f"wrote {path}")
    return 0
