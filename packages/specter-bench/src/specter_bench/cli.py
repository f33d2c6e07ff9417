"""The ``specter`` command line.

Until the CLI lands (issue 7) every command says so plainly and exits non-zero.
"""

from __future__ import annotations

import sys

COMMANDS = ("generate", "bench", "profile-depth", "kernel-bench", "info")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    command = args[0] if args else "generate"
    print(
        f"specter {command}: not available yet. The specter CLI ({', '.join(COMMANDS)}) "
        "is being built in specter-bench; until it lands, use the packages' Python APIs.",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
