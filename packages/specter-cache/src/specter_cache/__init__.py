"""specter-cache.

Model-agnostic expert residency for Mixture-of-Experts inference: pinned host store, GPU
slot pools, replacement policies, routing counters and predictive prefetch.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
