"""``specter`` subcommands: each module's ``register(subparsers)`` adds one command."""
