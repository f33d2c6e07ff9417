"""Stateful property test: random lookup/prefetch/acquire/release/copy-progress sequences.

After every step: maps and slots agree, slot contents equal the store's tensors of the mapped
expert, no queued or in-use slot was evicted, protection counts equal the open claims (nothing
leaked), and on the trace the acquires made, Belady is never worse than any policy.
"""

import torch
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from cache_helpers import build_store
from specter_cache import ExpertCache, ExpertLayout, belady_loads, simulate_policy
from specter_cache.copy_engine import DeferredCopyEngine

L, E = 2, 6
LAYOUT = ExpertLayout({"a": ((3,), torch.float32), "b": ((2, 2), torch.int32)})
experts = st.lists(st.integers(0, E - 1), min_size=0, max_size=5)
layers = st.integers(0, L - 1)


class CacheMachine(RuleBasedStateMachine):
    @initialize(
        slots=st.lists(st.integers(1, 4), min_size=L, max_size=L),
        deferred=st.booleans(),
        policy=st.sampled_from(["lru", "lfu", "predictive"]),
        seed=st.integers(0, 2**16),
    )
    def setup(self, slots, deferred, policy, seed):
        self.store, self.reference = build_store(L, E, LAYOUT, seed=seed)
        self.engine = DeferredCopyEngine() if deferred else None
        self.cache = ExpertCache(
            self.store, slots_per_layer=slots, device="cpu", policy=policy, copy_engine=self.engine
        )
        self.slots = slots
        self.open = []  # [acquisition, iterator, current wave or None]
        self.trace = [[] for _ in range(L)]
        self.needed_total = 0

    # ------------------------------------------------------------------------------ rules
    @rule(layer=layers, ids=experts)
    def lookup(self, layer, ids):
        resident, missing = self.cache.lookup(layer, ids)
        held = set(self.cache.resident_experts(layer))
        assert set(resident) == set(ids) & held
        assert set(missing) == set(ids) - held

    @rule(layer=layers, ids=experts)
    def prefetch(self, layer, ids):
        before = set(self.cache.resident_experts(layer))
        issued = self.cache.prefetch({layer: ids})[layer]
        assert not set(issued) & before
        assert set(issued) <= set(ids)

    @rule(layer=layers, ids=experts)
    def set_plan(self, layer, ids):
        self.cache.set_plan({layer: ids})

    @precondition(lambda self: len(self.open) < 3)
    @rule(layer=layers, ids=experts.filter(bool))
    def start_acquire(self, layer, ids):
        acq = self.cache.acquire(layer, ids)
        self.trace[layer].append(set(ids))
        self.needed_total += len(set(ids))
        self.open.append([acq, iter(acq), None])

    @precondition(lambda self: self.open)
    @rule(data=st.data())
    def next_wave(self, data):
        entry = data.draw(st.sampled_from(self.open))
        acq, it, _ = entry
        try:
            wave = next(it)
        except StopIteration:
            self.open.remove(entry)
            return
        except RuntimeError as exc:
            message = str(exc)
        else:
            message = None
        if message is not None:
            # Allowed only when other open acquisitions of the layer hold the slots.
            assert "protected by other open acquisitions" in message
            event("slots contended")
            assert any(o is not entry and o[0].layer == acq.layer for o in self.open)
            self.open.remove(entry)
            return
        entry[2] = wave
        event(f"wave of {len(wave.experts)} experts")
        # A wave's experts are ready: their slots hold the store's tensors now.
        for e, s in zip(wave.experts, wave.slots, strict=True):
            self._assert_slot_holds(acq.layer, s, e)

    @precondition(lambda self: any(o[2] is not None for o in self.open))
    @rule(data=st.data())
    def release_wave(self, data):
        entry = data.draw(st.sampled_from([o for o in self.open if o[2] is not None]))
        entry[2].release()
        assert entry[2].released
        entry[2] = None

    @precondition(lambda self: self.open)
    @rule(data=st.data())
    def close_acquire(self, data):
        entry = data.draw(st.sampled_from(self.open))
        entry[1].close()
        assert entry[0].closed
        self.open.remove(entry)

    @precondition(lambda self: self.engine is not None)
    @rule(copies=st.integers(1, 8))
    def advance_copies(self, copies):
        event(f"copies run: {self.engine.step(copies) > 0}")

    # ------------------------------------------------------------------------- invariants
    def _assert_slot_holds(self, layer, slot, expert):
        tensors = self.cache.slot_tensors(layer)
        for name, ref in self.reference[(layer, expert)].items():
            assert torch.equal(tensors[name][slot], ref), (layer, slot, expert, name)

    @invariant()
    def maps_and_slots_agree(self):
        if not hasattr(self, "cache"):
            return
        for layer in range(L):
            states = self.cache.slot_states(layer)
            held = [s.expert for s in states if s.expert >= 0]
            assert len(held) == len(set(held)) <= self.slots[layer]
            for slot, info in enumerate(states):
                if info.expert >= 0:
                    assert self.cache.slot_of(layer, info.expert) == slot
            device_map = self.cache.expert_to_slot(layer).tolist()
            for e, slot in enumerate(device_map):
                if slot >= 0:
                    # The device map never points at a slot that does not hold the expert.
                    self._assert_slot_holds(layer, slot, e)
            for slot, info in enumerate(states):
                if info.expert >= 0 and info.ready:
                    assert device_map[info.expert] == slot

    @invariant()
    def claims_are_protected_and_nothing_leaks(self):
        if not hasattr(self, "cache"):
            return
        expected = [[0] * self.slots[layer] for layer in range(L)]
        for acq, _, _ in self.open:
            claims = [(e, s) for e, s in acq._ready] + [(e, s) for e, s, _ in acq._pending]
            for w in acq._outstanding:
                claims += list(zip(w.experts, w.slots, strict=True))
            for e, s in claims:
                assert self.cache.slot_of(acq.layer, e) == s, "a claimed slot was evicted"
                expected[acq.layer][s] += 1
        for layer in range(L):
            assert [s.protected for s in self.cache.slot_states(layer)] == expected[layer]

    @invariant()
    def statistics_add_up(self):
        if not hasattr(self, "cache"):
            return
        total = self.cache.stats()["total"]
        assert total["hits"] + total["misses"] == self.needed_total
        loads = total["demand_loads"] + total["prefetch_loads"]
        assert total["bytes_moved"] == loads * LAYOUT.payload_bytes

    def teardown(self):
        if not hasattr(self, "cache"):
            return
        for _, it, _ in list(self.open):
            it.close()
        self.cache.synchronize()
        for layer in range(L):
            assert all(s.protected == 0 for s in self.cache.slot_states(layer))
            expect = [-1] * E
            for slot, info in enumerate(self.cache.slot_states(layer)):
                if info.expert >= 0:
                    expect[info.expert] = slot
                    self._assert_slot_holds(layer, slot, info.expert)
            assert self.cache.expert_to_slot(layer).tolist() == expect
        if any(self.trace):
            trace = [t if t else [set()] for t in self.trace]
            bound = belady_loads(trace, self.slots)
            for policy in ("lru", "lfu", "predictive"):
                assert bound <= simulate_policy(trace, policy, self.slots, num_experts=E).loads


CacheMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestCacheMachine = CacheMachine.TestCase
