"""specter-bench.

The specter CLI, baselines and benchmark experiments with tables and plots.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
