"""``specter report``: result JSON lines to the markdown tables and PNG plots of a page."""

from __future__ import annotations

import argparse

from specter_bench.commands.args import CommandError

__all__ = ["register", "run"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``specter report``."""
    report = subparsers.add_parser(
        "report",
        help="turn result JSON lines into markdown tables and PNG plots",
        description=(
            "With --index: write the whole curated results page (default docs/results.md) from "
            "the files an index lists, each table row naming its file. With result files: "
            "write a results section into a markdown page between marker comments."
        ),
    )
    report.add_argument("results", nargs="*", help="JSON-lines files from specter bench")
    report.add_argument(
        "--index",
        default=None,
        help="the results index (benchmarks/results/README.md): a markdown table of file, "
        "backs, command, commit, GPU",
    )
    report.add_argument("--markdown", default="docs/results.md")
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
    """Write the page; exit status 0."""
    from specter_bench.report import write_report
    from specter_bench.results_page import write_results_page

    if bool(args.results) == bool(args.index):
        raise CommandError(
            "give either --index INDEX (the curated results page) or result files "
            f"(got {len(args.results)} files and --index {args.index!r})."
        )
    if args.index:
        path = write_results_page(args.index, args.markdown, args.plots_dir)
    else:
        path = write_report(args.results, args.markdown, args.plots_dir, commands=args.commands)
    print(f"wrote {path}")
    return 0
