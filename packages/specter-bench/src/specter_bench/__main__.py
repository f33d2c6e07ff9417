"""``python -m specter_bench`` runs the ``specter`` CLI."""

from specter_bench.cli import main

raise SystemExit(main())
