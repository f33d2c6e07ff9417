"""Replacement policies: which resident expert of a layer gives up its slot.

Every policy sees the same events per layer (an expert inserted into a slot, accessed by a
computation, evicted) and answers one question: among these evictable experts, which one goes?
The cache decides *which* experts are evictable (never a protected slot); the policy only
orders them. Policies are stateful: give each cache its own instance.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence


class ReplacementPolicy(ABC):
    """The interface every policy implements (all methods are per layer)."""

    name: str = "policy"

    def reset(self, num_layers: int, num_experts: int) -> None:
        """Forget all history; called by the cache that owns the policy."""
        self._clock = 0
        self._last_use = [[-1] * num_experts for _ in range(num_layers)]

    def _tick(self, layer: int, expert: int) -> None:
        self._clock += 1
        self._last_use[layer][expert] = self._clock

    def on_insert(self, layer: int, expert: int) -> None:
        """``expert`` was loaded into a slot of ``layer`` (by prefetch or on demand)."""
        self._tick(layer, expert)

    def on_access(self, layer: int, expert: int) -> None:
        """``expert`` of ``layer`` is used by a computation."""
        self._tick(layer, expert)

    def on_evict(self, layer: int, expert: int) -> None:  # noqa: B027 (optional hook)
        """``expert`` of ``layer`` lost its slot."""

    def set_plan(self, plan: Mapping[int, Sequence[int]]) -> None:  # noqa: B027 (optional hook)
        """The planner's current per-layer plan (ranked, most wanted first). Default: ignored."""

    @abstractmethod
    def choose_victim(self, layer: int, candidates: Sequence[int]) -> int:
        """Pick the expert to evict among ``candidates`` (non-empty, all resident, evictable)."""

    def choose_victims(self, layer: int, candidates: Sequence[int], count: int) -> list[int]:
        """The first ``count`` experts to evict among ``candidates``, in eviction order: what
        ``count`` calls of :meth:`choose_victim`, each without the experts chosen before,
        return (with no evictions between them). Policies override it with one sort."""
        rest = list(candidates)
        victims: list[int] = []
        while rest and len(victims) < count:
            victim = self.choose_victim(layer, rest)
            rest.remove(victim)
            victims.append(victim)
        return victims


class LRUPolicy(ReplacementPolicy):
    """Least recently used (inserted or accessed) goes first."""

    name = "lru"

    def choose_victim(self, layer: int, candidates: Sequence[int]) -> int:
        last = self._last_use[layer]
        return min(candidates, key=lambda e: (last[e], e))

    def choose_victims(self, layer: int, candidates: Sequence[int], count: int) -> list[int]:
        last = self._last_use[layer]
        return sorted(candidates, key=lambda e: (last[e], e))[: max(count, 0)]


class LFUPolicy(ReplacementPolicy):
    """Least frequently accessed since it became resident goes first; ties by LRU.

    A prefetched expert that was never accessed has frequency 0, so a wrong prediction is the
    first to go.
    """

    name = "lfu"

    def reset(self, num_layers: int, num_experts: int) -> None:
        super().reset(num_layers, num_experts)
        self._freq = [[0] * num_experts for _ in range(num_layers)]

    def on_insert(self, layer: int, expert: int) -> None:
        super().on_insert(layer, expert)
        self._freq[layer][expert] = 0

    def on_access(self, layer: int, expert: int) -> None:
        super().on_access(layer, expert)
        self._freq[layer][expert] += 1

    def on_evict(self, layer: int, expert: int) -> None:
        self._freq[layer][expert] = 0

    def choose_victim(self, layer: int, candidates: Sequence[int]) -> int:
        freq, last = self._freq[layer], self._last_use[layer]
        return min(candidates, key=lambda e: (freq[e], last[e], e))

    def choose_victims(self, layer: int, candidates: Sequence[int], count: int) -> list[int]:
        freq, last = self._freq[layer], self._last_use[layer]
        return sorted(candidates, key=lambda e: (freq[e], last[e], e))[: max(count, 0)]


class PredictivePolicy(ReplacementPolicy):
    """Keep the planner's current plan resident; otherwise least recently used.

    Experts outside the layer's plan go first (LRU among them); when every candidate is
    planned, the lowest-ranked planned expert goes (ties by LRU).
    """

    name = "predictive"

    def reset(self, num_layers: int, num_experts: int) -> None:
        super().reset(num_layers, num_experts)
        self._rank: list[dict[int, int]] = [{} for _ in range(num_layers)]

    def set_plan(self, plan: Mapping[int, Sequence[int]]) -> None:
        for layer, experts in plan.items():
            self._rank[layer] = {e: r for r, e in enumerate(experts)}

    def clear_plan(self) -> None:
        """Forget every layer's plan (pure LRU until the next ``set_plan``)."""
        for ranks in self._rank:
            ranks.clear()

    def plan(self, layer: int) -> list[int]:
        """The current plan of ``layer``, ranked."""
        return sorted(self._rank[layer], key=self._rank[layer].__getitem__)

    def choose_victim(self, layer: int, candidates: Sequence[int]) -> int:
        rank, last = self._rank[layer], self._last_use[layer]
        unplanned = [e for e in candidates if e not in rank]
        if unplanned:
            return min(unplanned, key=lambda e: (last[e], e))
        return max(candidates, key=lambda e: (rank[e], -last[e], -e))

    def choose_victims(self, layer: int, candidates: Sequence[int], count: int) -> list[int]:
        rank, last = self._rank[layer], self._last_use[layer]
        unplanned = sorted((e for e in candidates if e not in rank), key=lambda e: (last[e], e))
        planned = sorted((e for e in candidates if e in rank), key=lambda e: (-rank[e], last[e], e))
        return (unplanned + planned)[: max(count, 0)]


POLICIES: dict[str, type[ReplacementPolicy]] = {
    "lru": LRUPolicy,
    "lfu": LFUPolicy,
    "predictive": PredictivePolicy,
}


def make_policy(policy: str | ReplacementPolicy) -> ReplacementPolicy:
    """A policy from its name (``"lru"``, ``"lfu"``, ``"predictive"``) or an instance.

    Raises:
        ValueError: an unknown name.
        TypeError: neither a name nor a ``ReplacementPolicy``.
    """
    if isinstance(policy, ReplacementPolicy):
        return policy
    if isinstance(policy, str):
        try:
            return POLICIES[policy]()
        except KeyError:
            raise ValueError(
                f"unknown replacement policy {policy!r}; choose one of {sorted(POLICIES)} "
                "or pass a ReplacementPolicy instance"
            ) from None
    raise TypeError(f"policy must be a name or a ReplacementPolicy, got {type(policy).__name__}")
