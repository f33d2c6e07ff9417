"""Turn benchmark JSON lines into docs/benchmarks.md tables and PNG plots.

    python scripts/make_report.py benchmarks/results/bench-*.jsonl
    python scripts/make_report.py $OUT/bench-deepseek-v2-lite-gpu.jsonl \
        --markdown $OUT/report-deepseek-v2-lite.md --plots-dir $OUT

The same as ``specter report``: the results section of the page (between its marker
comments) is replaced, everything else on the page is kept. Plot links are relative to the
page.
"""

from __future__ import annotations

import argparse
import sys

from specter_bench.report import write_report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="JSON-lines files written by specter bench")
    parser.add_argument("--markdown", default="docs/benchmarks.md", help="the page to update")
    parser.add_argument("--plots-dir", default=None, help="default: <page folder>/img")
    parser.add_argument(
        "--list-command", action="append", default=[], help="a command to list (repeatable)"
    )
    args = parser.parse_args(argv)
    try:
        page = write_report(args.results, args.markdown, args.plots_dir, commands=args.list_command)
    except (FileNotFoundError, ValueError) as exc:
        print(f"make_report: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {page}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
