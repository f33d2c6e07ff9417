"""specter-cache.

Model-agnostic expert residency for Mixture-of-Experts inference: pinned host store, GPU
slot pools, replacement policies, routing counters and predictive prefetch.

An expert is a fixed set of named tensors (``ExpertLayout``); the host copy of every
(layer, expert) lives in an ``ExpertStore``; an ``ExpertCache`` keeps ``S`` of them per layer
on the device and hands them to computations in waves; ``RoutingCounter``, ``PrefetchPlanner``
and ``SpeculativePrefetcher`` turn a draft model's routing into prefetches.
"""

from specter_cache.belady import belady_layer_loads, belady_loads
from specter_cache.cache_stats import CacheStats, LayerStats
from specter_cache.copy_engine import (
    CopyEngine,
    CudaCopyEngine,
    DeferredCopyEngine,
    ImmediateCopyEngine,
    TransferEvent,
    default_copy_engine,
)
from specter_cache.expert_cache import Acquisition, ExpertCache, SlotInfo, Wave
from specter_cache.expert_layout import ExpertLayout, TensorSpec
from specter_cache.expert_store import ExpertStore, TensorSlice
from specter_cache.prefetch_planner import (
    BoundaryDecision,
    PlannerConfig,
    PlannerPhase,
    PrefetchPlanner,
)
from specter_cache.replacement_policy import (
    LFUPolicy,
    LRUPolicy,
    PredictivePolicy,
    ReplacementPolicy,
    make_policy,
)
from specter_cache.routing_counter import PendingSnapshot, RoutingCounter
from specter_cache.safetensors_file import SafetensorsFile
from specter_cache.speculative_prefetcher import SpeculativePrefetcher
from specter_cache.trace_simulation import (
    SimulationResult,
    compare_policies,
    simulate_policy,
    windowed_trace,
)

__version__ = "0.1.0"

__all__ = [
    "Acquisition",
    "BoundaryDecision",
    "CacheStats",
    "CopyEngine",
    "CudaCopyEngine",
    "DeferredCopyEngine",
    "ExpertCache",
    "ExpertLayout",
    "ExpertStore",
    "ImmediateCopyEngine",
    "LFUPolicy",
    "LRUPolicy",
    "LayerStats",
    "PendingSnapshot",
    "PlannerConfig",
    "PlannerPhase",
    "PredictivePolicy",
    "PrefetchPlanner",
    "ReplacementPolicy",
    "RoutingCounter",
    "SafetensorsFile",
    "SimulationResult",
    "SlotInfo",
    "SpeculativePrefetcher",
    "TensorSlice",
    "TensorSpec",
    "TransferEvent",
    "Wave",
    "__version__",
    "belady_layer_loads",
    "belady_loads",
    "compare_policies",
    "default_copy_engine",
    "make_policy",
    "simulate_policy",
    "windowed_trace",
]
