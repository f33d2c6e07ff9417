"""specter-cache: model-agnostic expert residency for Mixture-of-Experts inference.

An expert is a fixed set of named tensors (``ExpertLayout``); the host copy of every
(layer, expert) lives in an ``ExpertStore``; an ``ExpertCache`` keeps ``S`` of them per layer
on the device, evicting by a ``ReplacementPolicy``, and hands them to computations in waves;
``RoutingCounter``, ``PrefetchPlanner`` and ``SpeculativePrefetcher`` turn a draft model's
routing into prefetches; ``cache.stats()`` reports what happened (``CacheStats``), and
``simulate_policy`` / ``belady_loads`` replay a routing trace offline.

The parts behind these (slot pools, the copy pipeline and its engines, the streamed-miss
protocol, the safetensors reader) are importable from their modules.
"""

from specter_cache.belady import belady_loads
from specter_cache.cache_stats import CacheStats
from specter_cache.expert_cache import ExpertCache
from specter_cache.expert_layout import ExpertLayout
from specter_cache.expert_store import ExpertStore
from specter_cache.prefetch_planner import PlannerConfig, PrefetchPlanner
from specter_cache.replacement_policy import (
    LFUPolicy,
    LRUPolicy,
    PredictivePolicy,
    ReplacementPolicy,
    make_policy,
)
from specter_cache.routing_counter import RoutingCounter
from specter_cache.speculative_prefetcher import SpeculativePrefetcher
from specter_cache.trace_simulation import simulate_policy

__version__ = "0.1.0"

__all__ = [
    "CacheStats",
    "ExpertCache",
    "ExpertLayout",
    "ExpertStore",
    "LFUPolicy",
    "LRUPolicy",
    "PlannerConfig",
    "PredictivePolicy",
    "PrefetchPlanner",
    "ReplacementPolicy",
    "RoutingCounter",
    "SpeculativePrefetcher",
    "__version__",
    "belady_loads",
    "make_policy",
    "simulate_policy",
]
