"""Helpers shared by specter-cache's tests (importable: conftest puts tests/ on sys.path)."""

from __future__ import annotations

import pytest
import torch

from specter_cache import ExpertLayout, ExpertStore

# Experts of CUDA tests: large enough that a copy or a matmul takes measurable device time.
CUDA_LAYOUT = ExpertLayout({"w": ((256, 256), torch.float32), "b": ((256,), torch.float32)})
SLEEP_CYCLES = 50_000_000  # tens of milliseconds: far longer than the copies


def cuda(test):
    """Mark ``test`` as needing a CUDA device: skipped elsewhere, selected by ``pytest -m gpu``."""
    needs = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
    return pytest.mark.gpu(needs(test))


def random_expert(layout: ExpertLayout, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Fresh random tensors matching ``layout``."""
    out = {}
    for name, spec in layout.specs.items():
        if spec.dtype.is_floating_point:
            out[name] = torch.randn(spec.shape, generator=generator).to(spec.dtype)
        else:
            out[name] = torch.randint(-1000, 1000, spec.shape, generator=generator).to(spec.dtype)
    return out


def build_store(
    num_layers: int,
    num_experts: int,
    layout: ExpertLayout | None = None,
    seed: int = 0,
    **store_kwargs,
) -> tuple[ExpertStore, dict[tuple[int, int], dict[str, torch.Tensor]]]:
    """A store filled with random experts, plus an independent copy of what was put."""
    if layout is None:
        layout = ExpertLayout({"gate_up": ((6, 4), torch.float16), "down": ((4, 3), torch.float16)})
    g = torch.Generator().manual_seed(seed)
    store = ExpertStore(num_layers, num_experts, layout, **store_kwargs)
    reference = {}
    for layer in range(num_layers):
        for e in range(num_experts):
            tensors = random_expert(layout, g)
            store.put(layer, e, tensors)
            reference[(layer, e)] = {k: v.clone() for k, v in tensors.items()}
    return store, reference


def assert_slots_hold(cache, store, layer, experts):
    """Each of ``experts`` holds a slot of ``layer`` whose tensors equal the store's."""
    tensors = cache.slot_tensors(layer)
    for e in experts:
        slot = cache.slot_of(layer, e)
        assert slot >= 0, f"expert {e} is not resident"
        for name, ref in store.get(layer, e).items():
            assert torch.equal(tensors[name][slot], ref), (layer, e, name)


def protected(cache, layer):
    """Protection count of every slot of ``layer``."""
    return [s.protected for s in cache.slot_states(layer)]


# Every method that reads or changes the cache's bookkeeping, with arguments valid on a
# 2-layer, 8-expert, 3-slot cache.
SETTLING_CALLS = {
    "lookup": lambda c: c.lookup(0, [1]),
    "set_plan": lambda c: c.set_plan({0: [1]}),
    "prefetch": lambda c: c.prefetch({0: [4]}),
    "acquire": lambda c: c.acquire(0, [1]).close(),
    "pin": lambda c: c.pin(1, [2]),
    "unpin": lambda c: c.unpin(0, [1]),
    "prepare_fills": lambda c: c.streamed.prepare_fills(1),
    "stream_guard": lambda c: c.streamed.stream_guard(),
    "take_needed": lambda c: c.take_needed(),
    "expire_prefetches": lambda c: c.expire_prefetches(),
    "stats": lambda c: c.stats(),
    "reset_stats": lambda c: c.reset_stats(),
    "resident_experts": lambda c: c.resident_experts(0),
    "slot_of": lambda c: c.slot_of(0, 1),
    "slot_states": lambda c: c.slot_states(0),
    "streaming": lambda c: setattr(c, "streaming", True),
}
