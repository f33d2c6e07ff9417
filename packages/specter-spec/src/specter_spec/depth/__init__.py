"""Depth policies: how the controller chooses the speculation depth K of each iteration.

:class:`FixedDepth` always runs one K; :class:`AdaptiveDepth` picks the K that maximises
expected committed tokens per second from the acceptance and costs it measures.
"""

from specter_spec.depth.adaptive import AdaptiveDepth, expected_committed
from specter_spec.depth.adaptive_config import AdaptiveDepthConfig
from specter_spec.depth.policy import DepthPolicy, FixedDepth, as_depth_policy, check_depth

__all__ = [
    "AdaptiveDepth",
    "AdaptiveDepthConfig",
    "DepthPolicy",
    "FixedDepth",
    "as_depth_policy",
    "check_depth",
    "expected_committed",
]
