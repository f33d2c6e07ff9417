"""Which expert holds which slot: the host's decisions over every layer's slot pool.

``Residency`` owns the ``LayerPool`` of every layer, the ``[L, E + 1]`` device maps they
are rows of, the replacement policy and the statistics. It chooses where a load goes (an
empty slot, else the policy's victim among the slots no claim or pin protects), assigns it
on the host (the evicted expert leaves the bookkeeping at once), answers lookups, keeps pins,
the prefetch window (prefetched experts not used yet) and the window of needed experts. It
issues no copies: the ``CopyPipeline`` moves what it decides.

Counts may arrive late: ``count_later`` queues one, and every read or decision here runs the
queue first (``settle``), so each sees exactly the counts it would have seen at once.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from specter_cache.cache_stats import CacheStats
from specter_cache.expert_store import ExpertStore
from specter_cache.replacement_policy import ReplacementPolicy, make_policy
from specter_cache.slot_pool import LayerPool, SlotInfo, as_expert_list

Load = tuple[int, int, int, int]
"""One load decided on the host: ``(layer, expert, slot, evicted expert or -1)``."""


class Residency:
    """Host bookkeeping of the slot pools of every layer.

    Args:
        store: the host store (layouts, ``L``, ``E``, bytes per expert).
        slots: slots of each layer.
        device: device of the slot tensors and maps.
        policy: a policy name or instance (``make_policy``).
    """

    def __init__(
        self,
        store: ExpertStore,
        slots: Sequence[int],
        device: torch.device,
        policy: str | ReplacementPolicy,
    ):
        L, E = store.num_layers, store.num_experts
        self.num_layers, self.num_experts = L, E
        self.policy = make_policy(policy)
        self.policy.reset(L, E)
        # Every layer's device map in one tensor (row views per pool), with a spare column E
        # that scatters aim at for entries they must leave alone (``commit_fills``).
        self.maps = torch.full((L, E + 1), -1, dtype=torch.int32, device=device)
        self.pools = [
            LayerPool(store, layer, slots[layer], device, self.maps[layer, :E])
            for layer in range(L)
        ]
        self.stats = CacheStats(L)
        self.expert_bytes = [store.expert_bytes(layer) for layer in range(L)]
        self._resident_layers: set[int] = set()  # all_resident() answers that stay True
        self._pending_counts: list[Callable[[], None]] = []  # count_later's, oldest first

    # ------------------------------------------------------------------------ validation
    def check_layer(self, layer: object) -> int:
        """``layer`` as an index, or ValueError naming it."""
        if (
            not isinstance(layer, int)
            or isinstance(layer, bool)
            or not 0 <= layer < self.num_layers
        ):
            raise ValueError(f"layer must be an int in [0, {self.num_layers}), got {layer!r}")
        return layer

    def check_plan(self, plan: Mapping[int, Sequence[int]]) -> dict[int, list[int]]:
        """``layer -> expert ids``, validated (unique ids, first-seen order)."""
        if not isinstance(plan, Mapping):
            raise TypeError(f"a plan maps layer -> expert ids, got {type(plan).__name__}")
        return {
            self.check_layer(layer): as_expert_list(
                experts, self.num_experts, f"plan[layer {layer}]"
            )
            for layer, experts in plan.items()
        }

    def expert_ids(self, experts: object, where: str) -> list[int]:
        """Validated unique expert ids (see ``as_expert_list``)."""
        return as_expert_list(experts, self.num_experts, where)

    # -------------------------------------------------------------------- deferred counts
    def count_later(self, count: Callable[[], None]) -> None:
        """Queue ``count`` to run at the next read or decision (see ``settle``)."""
        if not callable(count):
            raise TypeError(f"count_later needs a callable, got {type(count).__name__}")
        self._pending_counts.append(count)

    @property
    def counts_pending(self) -> int:
        """How many queued counts have not run yet."""
        return len(self._pending_counts)

    def settle(self) -> None:
        """Run the queued counts, oldest first (a no-op without any)."""
        while self._pending_counts:
            self._pending_counts.pop(0)()

    # --------------------------------------------------------------------------- lookups
    def lookup(self, layer: int, experts: object) -> tuple[list[int], list[int]]:
        """``(resident or in flight, missing)`` among ``experts`` of ``layer``."""
        self.settle()
        pool = self.pools[self.check_layer(layer)]
        ids = as_expert_list(experts, self.num_experts, f"lookup(layer={layer})")
        return [e for e in ids if e in pool.expert_slot], [
            e for e in ids if e not in pool.expert_slot
        ]

    def slot_states(self, layer: int) -> list[SlotInfo]:
        """Host view of every slot of ``layer``."""
        self.settle()
        pool = self.pools[self.check_layer(layer)]
        return [
            SlotInfo(e, pool.ready[s] is None or pool.ready[s].query(), pool.protect[s])  # type: ignore[union-attr]
            for s, e in enumerate(pool.slot_expert)
        ]

    def all_resident(self, layer: int) -> bool:
        """Whether every expert of ``layer`` is loaded in a slot of its own (a True answer
        is remembered: nothing can be evicted there any more)."""
        layer = self.check_layer(layer)
        if layer in self._resident_layers:
            return True
        pool = self.pools[layer]
        if pool.num_slots < self.num_experts:
            return False  # whatever the queued counts hold: no settling (and waiting) here
        self.settle()
        resident = all(e >= 0 for e in pool.slot_expert) and all(
            pool.landed(s) for s in range(pool.num_slots)
        )
        if resident:
            self._resident_layers.add(layer)
        return resident

    def resident_experts(self, layer: int) -> list[int]:
        """Experts of ``layer`` that hold a slot (loaded or in flight), by slot order."""
        self.settle()
        return [e for e in self.pools[self.check_layer(layer)].slot_expert if e >= 0]

    def slot_of(self, layer: int, expert: int) -> int:
        """Slot of ``expert`` (loaded or in flight), ``-1`` if it is not resident."""
        self.settle()
        return self.pools[self.check_layer(layer)].expert_slot.get(expert, -1)

    # -------------------------------------------------------------------------- eviction
    def free_slot(self, layer: int, keep: Sequence[int] | set[int]) -> int | None:
        """An empty slot, or the slot of a policy-chosen evictable expert not in ``keep``."""
        pool = self.pools[layer]
        if pool.empty:
            return pool.empty.pop()
        return self.victim_slot(layer, pool.evictable_slots(keep))

    def victim_slot(self, layer: int, evictable: list[int]) -> int | None:
        """The slot of the policy's victim among the experts in ``evictable`` slots (removed
        from the list: it will hold an expert that is kept), or None when it is empty.

        Raises:
            RuntimeError: the policy chose an expert that is not a candidate.
        """
        if not evictable:
            return None
        pool = self.pools[layer]
        candidates = [pool.slot_expert[s] for s in evictable]
        victim = self.policy.choose_victim(layer, candidates)
        if victim not in candidates:
            raise RuntimeError(
                f"policy {self.policy.name!r} chose expert {victim!r} in layer {layer}, which "
                f"is not one of the evictable candidates {candidates}"
            )
        slot = pool.expert_slot[victim]
        evictable.remove(slot)
        return slot

    def assign(self, layer: int, expert: int, slot: int) -> int:
        """The host's side of a load: ``slot`` now holds ``expert``; returns the expert it
        evicted (-1: the slot was empty)."""
        pool = self.pools[layer]
        old = pool.slot_expert[slot]
        if old >= 0:
            del pool.expert_slot[old]
            self.policy.on_evict(layer, old)
            st = self.stats.layers[layer]
            st.evictions += 1
            if old in pool.prefetched:
                pool.prefetched.discard(old)
                st.prefetch_wasted += 1
        pool.slot_expert[slot] = expert
        pool.expert_slot[expert] = slot
        self.policy.on_insert(layer, expert)
        return old

    def prefetch_loads(
        self, plan: Mapping[int, list[int]]
    ) -> tuple[dict[int, list[int]], list[Load]]:
        """Decide and assign the loads of a checked plan (see ``ExpertCache.prefetch``).

        Per layer, experts in plan order; each takes an empty slot or evicts the policy's
        choice among the unprotected experts outside the layer's plan; the rest of a layer's
        plan is dropped once no slot can be freed.

        Returns:
            ``(layer -> experts loaded, loads in issue order)``.
        """
        issued: dict[int, list[int]] = {}
        loads: list[Load] = []
        for layer, experts in plan.items():
            pool = self.pools[layer]
            st = self.stats.layers[layer]
            planned = set(experts)
            loaded: list[int] = []
            evictable: list[int] | None = None  # slots a load may take, made on first need
            for i, e in enumerate(experts):
                if e in pool.expert_slot:
                    continue
                if pool.empty:
                    slot = pool.empty.pop()
                else:
                    if evictable is None:
                        evictable = pool.evictable_slots(planned)
                    slot = self.victim_slot(layer, evictable)
                if slot is None:
                    st.prefetch_dropped += sum(1 for x in experts[i:] if x not in pool.expert_slot)
                    break
                loads.append((layer, e, slot, self.assign(layer, e, slot)))
                pool.prefetched.add(e)
                loaded.append(e)
            nbytes = len(loaded) * self.expert_bytes[layer]
            st.prefetch_loads += len(loaded)
            st.prefetch_bytes += nbytes
            st.bytes_moved += nbytes
            issued[layer] = loaded
        return issued, loads

    # ------------------------------------------------------------------------------ pins
    def pins_to_add(self, layer: int, experts: object) -> tuple[list[int], list[int]]:
        """``(experts not pinned yet, those of them not resident)``, after checking that
        the pins leave the layer an evictable slot."""
        self.settle()
        pool = self.pools[layer]
        ids = as_expert_list(experts, self.num_experts, f"pin(layer={layer})")
        new = [e for e in ids if e not in pool.pinned]
        total = len(pool.pinned) + len(new)
        if pool.num_slots < self.num_experts and total >= pool.num_slots:
            raise ValueError(
                f"pinning {total} experts of layer {layer} leaves none of its "
                f"{pool.num_slots} slots evictable; pin at most {pool.num_slots - 1}"
            )
        return new, [e for e in new if e not in pool.expert_slot]

    def add_pins(self, layer: int, new: list[int], missing: list[int], loaded: list[int]) -> None:
        """Pin ``new`` (resident now: ``loaded`` are the ``missing`` ones a prefetch loaded,
        which never count as wasted).

        Raises:
            RuntimeError: some missing expert found no slot.
        """
        pool = self.pools[layer]
        pool.prefetched.difference_update(loaded)  # pinned on purpose: never wasted
        if len(loaded) != len(missing):
            raise RuntimeError(
                f"pin(layer={layer}): only {len(loaded)} of {len(missing)} missing experts "
                "found a slot; open acquisitions protect the rest, so pin between forwards"
            )
        for e in new:
            pool.protect[pool.expert_slot[e]] += 1
            pool.pinned.add(e)

    def pinned(self, layer: int) -> list[int]:
        """The pinned experts of ``layer``, sorted."""
        return sorted(self.pools[self.check_layer(layer)].pinned)

    def unpin(self, layer: int, experts: object) -> list[int]:
        """Unprotect pinned ``experts`` of ``layer``; returns those unpinned."""
        self.settle()
        pool = self.pools[layer]
        ids = as_expert_list(experts, self.num_experts, f"unpin(layer={layer})")
        done = [e for e in ids if e in pool.pinned]
        for e in done:
            pool.protect[pool.expert_slot[e]] -= 1
            pool.pinned.discard(e)
        return done

    # --------------------------------------------------------------------------- windows
    def expire_prefetches(self) -> int:
        """Count the prefetched experts not used so far as wasted; returns how many."""
        self.settle()
        wasted = 0
        for pool, st in zip(self.pools, self.stats.layers, strict=True):
            st.prefetch_wasted += len(pool.prefetched)
            wasted += len(pool.prefetched)
            pool.prefetched.clear()
        return wasted

    def take_needed(self) -> dict[int, set[int]]:
        """Experts needed since the last call, per layer (then forgotten)."""
        self.settle()
        out = {layer: p.needed_window for layer, p in enumerate(self.pools) if p.needed_window}
        for p in self.pools:
            p.needed_window = set()
        return out
