"""The streamed miss path: verification reads missing experts in place from the host store."""

from __future__ import annotations

import pytest
import torch

from model_helpers import random_prompt, reference_from_checkpoint, speculate_beside_transformers
from specter_cache import DeferredCopyEngine, ExpertCache
from specter_models import load
from specter_models.streamed_misses import STREAM_MAX_ROWS


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def _slot_states(lm):
    return [lm.cache.slot_states(layer) for layer in range(lm.cache.num_layers)]


@pytest.mark.parametrize("slots", [1, 3])
def test_a_streamed_forward_is_exact_and_loads_nothing(checkpoints, arch_name, slots):
    folder = checkpoints[arch_name]
    lm = load(folder, device="cpu", dtype=torch.float64, slots_per_layer=slots, miss_path="stream")
    assert lm.miss_path == "stream"
    assert lm.cache.streaming
    lm.cache.prefetch({layer: list(range(slots)) for layer in range(lm.cache.num_layers)})
    lm.cache.reset_stats()
    before = _slot_states(lm)
    ids = random_prompt(9, lm.config.vocab_size, seed=slots)
    got = lm.target.forward(ids, 0)
    torch.testing.assert_close(
        got, _logits(reference_from_checkpoint(folder), ids), rtol=0, atol=1e-10
    )
    assert _slot_states(lm) == before  # a streamed verification changes no slot
    total = lm.cache.stats()["total"]
    assert total["demand_loads"] == 0
    assert total["waves"] == 0
    assert total["streamed_reads"] == total["misses"] > 0
    assert total["bytes_moved"] == total["streamed_bytes"]
    assert total["hits"] + total["misses"] == sum(
        len(set(trace)) for trace in _routed_per_layer(lm, folder, ids)
    )


def _routed_per_layer(lm, folder, ids):
    """The experts each MoE layer routed ``ids`` to, from a load-path forward's trace."""
    reference = load(folder, device="cpu", dtype=torch.float64, slots_per_layer=8)
    reference.runtime.record_routing()
    reference.target.forward(ids, 0)
    return [steps[0] for steps in reference.runtime.routing_trace]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_stream_and_load_paths_give_the_same_bits(checkpoints, arch_name, dtype):
    folder = checkpoints[arch_name]
    ids = random_prompt(7, 96, seed=3)
    logits = {}
    for path in ("load", "stream"):
        lm = load(
            folder, device="cpu", dtype=dtype, slots_per_layer=2, batch_invariant=True,
            miss_path=path,
        )  # fmt: skip
        lm.target.forward(ids[:, :3], 0)
        logits[path] = lm.target.forward(ids[:, 3:], 3)
    assert torch.equal(logits["stream"], logits["load"])


@pytest.mark.parametrize("depth", [1, 4])
def test_greedy_speculation_on_the_streamed_path_equals_transformers(checkpoints, arch_name, depth):
    folder = checkpoints[arch_name]
    lm = load(folder, device="cpu", dtype=torch.float64, slots_per_layer=3, miss_path="stream")
    prompt = random_prompt(6, lm.config.vocab_size, seed=depth + 40)
    result, expected = speculate_beside_transformers(lm, folder, prompt, depth, 20)
    assert result.tokens == expected
    total = lm.cache.stats()["total"]
    assert total["streamed_reads"] > 0
    assert total["prefetch_loads"] > 0  # the draft's routing still fills the slots


def test_experts_still_in_flight_are_streamed(checkpoints):
    folder = checkpoints["tiny-qwen2-moe"]
    lm = load(folder, device="cpu", dtype=torch.float64, slots_per_layer=8, miss_path="stream")
    engine = DeferredCopyEngine()
    cache = ExpertCache(lm.cache.store, slots_per_layer=8, device="cpu", copy_engine=engine)
    lm.runtime.cache = lm.cache = cache
    lm.miss_path = "stream"  # the new cache streams too
    cache.prefetch({layer: list(range(8)) for layer in range(cache.num_layers)})
    assert engine.pending > 0  # every load queued, none landed
    ids = random_prompt(5, lm.config.vocab_size, seed=8)
    got = lm.target.forward(ids, 0)
    torch.testing.assert_close(
        got, _logits(reference_from_checkpoint(folder), ids), rtol=0, atol=1e-10
    )
    total = cache.stats()["total"]
    assert total["streamed_reads"] == total["misses"] == total["hits"] + total["misses"]
    engine.synchronize()
    assert cache.every_layer_resident()


def test_a_long_prefill_acquires_instead(checkpoints):
    folder = checkpoints["tiny-deepseek-v2"]
    lm = load(folder, device="cpu", dtype=torch.float64, slots_per_layer=3, miss_path="stream")
    ids = random_prompt(STREAM_MAX_ROWS + 1, lm.config.vocab_size, seed=2)
    lm.target.forward(ids, 0)
    total = lm.cache.stats()["total"]
    assert total["demand_loads"] > 0
    assert total["streamed_reads"] == 0
    lm.target.forward(random_prompt(1, lm.config.vocab_size, seed=3), ids.shape[1])
    assert lm.cache.stats()["total"]["streamed_reads"] > 0  # the next step streams


def test_bad_miss_paths_are_refused(checkpoints):
    folder = checkpoints["tiny-phimoe"]
    with pytest.raises(ValueError, match=r"miss_path must be one of \('load', 'stream'\).*'zero'"):
        load(folder, device="cpu", dtype=torch.float32, miss_path="zero")
    lm = load(folder, device="cpu", dtype=torch.float32, slots_per_layer=2)
    assert lm.miss_path == "load"
    assert not lm.cache.streaming
    with pytest.raises(ValueError, match="'copy'"):
        lm.miss_path = "copy"
    lm.miss_path = "stream"
    lm.verification = "token"  # token-wise verification keeps the acquire path
    assert not lm.runtime.streams(1)


def test_padding_rows_of_a_window_step_stream_nothing(checkpoints, arch_name):
    # Window mode pads 9 rows to the 12-row bucket by repeating the last token; at their own
    # positions those rows route elsewhere, and on the streamed path they route nowhere.
    folder = checkpoints[arch_name]
    lm = load(folder, device="cpu", dtype=torch.float64, slots_per_layer=2, miss_path="stream")
    lm.enable_step_graphs(capture=False)  # window mode, eager: what a graph records
    assert lm.target.graphs.padded_rows(9, 0) == 12
    ids = random_prompt(9, lm.config.vocab_size, seed=11)
    got = lm.target.forward(ids, 0)
    torch.testing.assert_close(
        got, _logits(reference_from_checkpoint(folder), ids), rtol=0, atol=1e-10
    )
    routed = _routed_per_layer(lm, folder, ids)
    for layer, st in enumerate(lm.cache.stats()["per_layer"]):
        resident = set(lm.cache.resident_experts(layer))
        assert st["streamed_reads"] == len(set(routed[layer]) - resident)  # real rows only


def test_with_every_expert_resident_nothing_streams_or_is_recorded(checkpoints):
    lm = load(checkpoints["tiny-qwen2-moe"], device="cpu", dtype=torch.float32, miss_path="stream")
    assert lm.cache.every_layer_resident()
    assert not lm.runtime.streams(1)  # the all-resident single wave, no record to read
    lm.target.forward(random_prompt(3, lm.config.vocab_size, seed=1), 0)
    assert lm.cache.stats()["total"]["acquires"] == 0
