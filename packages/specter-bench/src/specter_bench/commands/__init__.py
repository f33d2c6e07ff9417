"""The ``specter`` subcommands, one module each (``register(subparsers)`` adds one)."""
