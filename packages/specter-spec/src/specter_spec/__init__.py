"""specter-spec.

Speculative decoding controller with exact greedy and sampled acceptance, KV rollback
and adaptive depth, for any draft/target pair.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
