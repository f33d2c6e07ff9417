"""The streamed miss path: verification reads missing experts in place from the host store."""

from __future__ import annotations

import itertools

import pytest
import torch

from model_helpers import random_prompt, reference_from_checkpoint, speculate_beside_transformers
from specter_cache import ExpertCache
from specter_cache.copy_engine import DeferredCopyEngine
from specter_models.loader import load_model
from specter_models.streamed_misses import STREAM_MAX_ROWS


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def _slot_states(lm):
    return [lm.cache.slot_states(layer) for layer in range(lm.cache.num_layers)]


@pytest.mark.parametrize("slots", [1, 3])
def test_a_streamed_forward_is_exact_and_loads_nothing(checkpoints, arch_name, slots):
    folder = checkpoints[arch_name]
    lm = load_model(
        folder, device="cpu", dtype=torch.float64, slots_per_layer=slots, miss_path="stream"
    )
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


def _deferred_cache(lm, slots: int):
    """Give ``lm`` a streaming cache of ``slots`` per layer whose copies run only when waited
    for (``DeferredCopyEngine``): loads stay in flight until something waits. Returns
    ``(cache, engine)``."""
    engine = DeferredCopyEngine()
    cache = ExpertCache(lm.cache.store, slots_per_layer=slots, device="cpu", copy_engine=engine)
    lm.runtime.cache = lm.cache = cache
    lm.miss_path = "stream"  # the new cache streams too
    return cache, engine


def _routed_per_layer(lm, folder, ids):
    """The experts each MoE layer routed ``ids`` to, from a load-path forward's trace."""
    reference = load_model(folder, device="cpu", dtype=torch.float64, slots_per_layer=8)
    reference.runtime.record_routing()
    reference.target.forward(ids, 0)
    return [steps[0] for steps in reference.runtime.routing_trace]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_stream_and_load_paths_give_the_same_bits(checkpoints, arch_name, dtype):
    folder = checkpoints[arch_name]
    ids = random_prompt(7, 96, seed=3)
    logits = {}
    for path in ("load", "stream"):
        lm = load_model(
            folder, device="cpu", dtype=dtype, slots_per_layer=2, batch_invariant=True,
            miss_path=path,
        )  # fmt: skip
        lm.target.forward(ids[:, :3], 0)
        logits[path] = lm.target.forward(ids[:, 3:], 3)
    assert torch.equal(logits["stream"], logits["load"])


@pytest.mark.parametrize("depth", [1, 4])
def test_greedy_speculation_on_the_streamed_path_equals_transformers(checkpoints, arch_name, depth):
    folder = checkpoints[arch_name]
    lm = load_model(
        folder, device="cpu", dtype=torch.float64, slots_per_layer=3, miss_path="stream",
        stream_fills=8,
    )  # fmt: skip
    prompt = random_prompt(6, lm.config.vocab_size, seed=depth + 40)
    result, expected = speculate_beside_transformers(lm, folder, prompt, depth, 20)
    assert result.tokens == expected
    total = lm.cache.stats()["total"]
    assert total["streamed_reads"] > 0
    assert total["prefetch_loads"] > 0  # the draft's routing still fills the slots
    assert total["streamed_fills"] > 0
    for layer in range(lm.cache.num_layers):  # the device map is the host's, fills included
        expected_map = [lm.cache.slot_of(layer, e) for e in range(lm.cache.num_experts)]
        assert lm.cache.expert_to_slot(layer).tolist() == expected_map


def test_without_waits_experts_still_in_flight_are_streamed(checkpoints):
    folder = checkpoints["tiny-qwen2-moe"]
    lm = load_model(
        folder, device="cpu", dtype=torch.float64, slots_per_layer=8, miss_path="stream",
        stream_waits=False,
    )  # fmt: skip
    cache, engine = _deferred_cache(lm, 8)
    cache.prefetch({layer: list(range(8)) for layer in range(cache.num_layers)})
    assert engine.pending > 0  # every load queued, none landed
    ids = random_prompt(5, lm.config.vocab_size, seed=8)
    got = lm.target.forward(ids, 0)
    torch.testing.assert_close(
        got, _logits(reference_from_checkpoint(folder), ids), rtol=0, atol=1e-10
    )
    total = cache.stats()["total"]
    assert total["streamed_reads"] == total["misses"] == total["hits"] + total["misses"]
    assert total["streamed_fills"] == 0  # every expert holds a slot already: none is filled
    engine.synchronize()
    assert cache.every_layer_resident()


def test_with_waits_experts_in_flight_land_and_are_read_from_their_slots(checkpoints):
    # stream_waits: each layer first waits for its loads in flight (the deferred engine
    # runs its queue up to them), so nothing planned is streamed and the bits are the same.
    folder = checkpoints["tiny-qwen2-moe"]
    lm = load_model(
        folder, device="cpu", dtype=torch.float64, slots_per_layer=8, miss_path="stream",
        stream_waits=True,
    )  # fmt: skip
    assert lm.stream_waits
    assert lm.runtime.stream_waits
    cache, engine = _deferred_cache(lm, 8)
    cache.prefetch({layer: list(range(8)) for layer in range(cache.num_layers)})
    queued = engine.pending
    assert queued > 0
    ids = random_prompt(5, lm.config.vocab_size, seed=8)
    got = lm.target.forward(ids, 0)
    torch.testing.assert_close(
        got, _logits(reference_from_checkpoint(folder), ids), rtol=0, atol=1e-10
    )
    total = cache.stats()["total"]
    assert total["streamed_reads"] == total["misses"] == 0
    assert total["hits"] > 0
    assert engine.pending == 0  # the last layer waited for the last load


def test_waits_cover_the_planned_experts_only(checkpoints):
    # Half of each layer's experts are planned: the waits land those, the rest stream.
    folder = checkpoints["tiny-deepseek-v2"]
    lm = load_model(
        folder, device="cpu", dtype=torch.float64, slots_per_layer=4, miss_path="stream"
    )
    assert lm.stream_waits  # the default
    cache, _ = _deferred_cache(lm, 4)
    cache.prefetch({layer: [0, 1, 2, 3] for layer in range(cache.num_layers)})
    ids = random_prompt(6, lm.config.vocab_size, seed=4)
    got = lm.target.forward(ids, 0)
    torch.testing.assert_close(
        got, _logits(reference_from_checkpoint(folder), ids), rtol=0, atol=1e-10
    )
    routed = _routed_per_layer(lm, folder, ids)
    total = cache.stats()["total"]
    expect_streamed = sum(len([e for e in set(r) if e >= 4]) for r in routed)
    assert total["streamed_reads"] == expect_streamed > 0
    assert total["hits"] == sum(len([e for e in set(r) if e < 4]) for r in routed) > 0


def test_bad_stream_waits_are_refused(checkpoints):
    folder = checkpoints["tiny-phimoe"]
    with pytest.raises(ValueError, match=r"stream_waits must be True .* or False .*got 1"):
        load_model(folder, device="cpu", dtype=torch.float32, stream_waits=1)
    lm = load_model(
        folder, device="cpu", dtype=torch.float32, slots_per_layer=2, miss_path="stream"
    )
    assert lm.stream_waits is True  # the default
    with pytest.raises(ValueError, match="stream_waits must be True"):
        lm.stream_waits = "yes"


def test_a_long_prefill_acquires_instead(checkpoints):
    folder = checkpoints["tiny-deepseek-v2"]
    lm = load_model(
        folder, device="cpu", dtype=torch.float64, slots_per_layer=3, miss_path="stream"
    )
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
        load_model(folder, device="cpu", dtype=torch.float32, miss_path="zero")
    lm = load_model(folder, device="cpu", dtype=torch.float32, slots_per_layer=2)
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
    lm = load_model(
        folder, device="cpu", dtype=torch.float64, slots_per_layer=2, miss_path="stream"
    )
    lm.enable_step_graphs(capture=False)  # window mode, eager: what a graph records
    assert lm.target.graphs.padded_rows(9, 0) == 12
    ids = random_prompt(9, lm.config.vocab_size, seed=11)
    before = [set(lm.cache.resident_experts(layer)) for layer in range(lm.cache.num_layers)]
    got = lm.target.forward(ids, 0)
    torch.testing.assert_close(
        got, _logits(reference_from_checkpoint(folder), ids), rtol=0, atol=1e-10
    )
    routed = _routed_per_layer(lm, folder, ids)
    for layer, st in enumerate(lm.cache.stats()["per_layer"]):
        assert st["streamed_reads"] == len(set(routed[layer]) - before[layer])  # real rows only
        filled = set(lm.cache.resident_experts(layer)) - before[layer]
        assert filled <= set(routed[layer])  # nor are padding rows' experts filled
        assert st["streamed_fills"] == len(filled)


def test_fills_make_streamed_experts_resident_for_no_transfer(checkpoints, arch_name):
    folder = checkpoints[arch_name]
    lm = load_model(
        folder, device="cpu", dtype=torch.float64, slots_per_layer=4, miss_path="stream",
        stream_fills=8,
    )  # fmt: skip
    assert lm.stream_fills == 8
    cache, store = lm.cache, lm.cache.store
    ids = random_prompt(6, lm.config.vocab_size, seed=21)
    reference = _logits(reference_from_checkpoint(folder), ids)
    torch.testing.assert_close(lm.target.forward(ids, 0), reference, rtol=0, atol=1e-10)
    routed = _routed_per_layer(lm, folder, ids)
    total = cache.stats()["total"]
    assert total["streamed_fills"] > 0
    assert total["demand_loads"] == total["prefetch_loads"] == 0  # nothing was copied in
    assert total["bytes_moved"] == total["streamed_bytes"]
    for layer in range(cache.num_layers):
        resident = cache.resident_experts(layer)
        assert set(resident) <= set(routed[layer])
        assert len(resident) == min(4, len(set(routed[layer])))  # the first 4 missing, by id
        assert (
            resident == sorted(set(routed[layer]))[: len(resident)]
            or sorted(resident) == (sorted(set(routed[layer]))[: len(resident)])
        )
        for e in resident:  # a filled slot holds the store's expert, and the map says so
            slot = cache.slot_of(layer, e)
            assert cache.expert_to_slot(layer)[e].item() == slot
            for name, tensor in cache.slot_tensors(layer).items():
                assert torch.equal(tensor[slot], store.get(layer, e)[name])
        missing = [e for e in range(cache.num_experts) if e not in resident]
        assert (cache.expert_to_slot(layer)[missing] == -1).all()
    # The same rows again: the filled experts hit, and the result does not change.
    cache.reset_stats()
    lm.kv.reset()
    torch.testing.assert_close(lm.target.forward(ids, 0), reference, rtol=0, atol=1e-10)
    again = cache.stats()["total"]
    assert again["hits"] == total["streamed_fills"]
    assert again["streamed_reads"] == total["streamed_reads"] - total["streamed_fills"]


def test_without_fills_a_streamed_forward_changes_no_slot(checkpoints):
    folder = checkpoints["tiny-deepseek-v2"]
    lm = load_model(
        folder, device="cpu", dtype=torch.float64, slots_per_layer=4, miss_path="stream"
    )
    assert lm.stream_fills == 0  # the default
    assert lm.runtime.stream_record.width == 0
    lm.target.forward(random_prompt(6, lm.config.vocab_size, seed=21), 0)
    assert all(not lm.cache.resident_experts(layer) for layer in range(lm.cache.num_layers))
    lm = load_model(
        folder, device="cpu", dtype=torch.float64, slots_per_layer=4, miss_path="stream",
        stream_fills=4,
    )  # fmt: skip
    lm.stream_fills = 0  # off for now: the record keeps its width
    lm.target.forward(random_prompt(6, lm.config.vocab_size, seed=21), 0)
    assert all(not lm.cache.resident_experts(layer) for layer in range(lm.cache.num_layers))
    assert lm.cache.stats()["total"]["streamed_fills"] == 0
    lm.stream_fills = 2  # back on, narrower than the record
    lm.target.forward(random_prompt(1, lm.config.vocab_size, seed=22), 6)
    filled = [len(lm.cache.resident_experts(layer)) for layer in range(lm.cache.num_layers)]
    assert 0 < max(filled) <= 2


def test_the_fill_width_is_loads_whatever_the_path_was_then(checkpoints):
    # A model loaded with fills may turn them off before its first streamed forward and
    # back on later: the stream record is made as wide as the load said.
    folder = checkpoints["tiny-deepseek-v2"]
    lm = load_model(folder, device="cpu", dtype=torch.float64, slots_per_layer=4, stream_fills=3)
    lm.stream_fills = 0
    lm.miss_path = "stream"
    assert lm.runtime.stream_record.width == 3
    lm.stream_fills = 3
    lm.target.forward(random_prompt(6, lm.config.vocab_size, seed=21), 0)
    assert lm.cache.stats()["total"]["streamed_fills"] > 0


def test_bad_stream_fills_are_refused(checkpoints):
    folder = checkpoints["tiny-phimoe"]
    with pytest.raises(ValueError, match=r"stream_fills must be an int >= 0.*-1"):
        load_model(folder, device="cpu", dtype=torch.float32, stream_fills=-1)
    lm = load_model(
        folder, device="cpu", dtype=torch.float32, slots_per_layer=2, miss_path="stream"
    )
    with pytest.raises(
        ValueError, match=r"stream_fills=9 is above this model's 0 candidate slots.*stream_fills=9"
    ):
        lm.stream_fills = 9
    with pytest.raises(ValueError, match="stream_fills must be an int >= 0"):
        lm.stream_fills = True


def test_with_every_expert_resident_nothing_streams_or_is_recorded(checkpoints):
    lm = load_model(
        checkpoints["tiny-qwen2-moe"], device="cpu", dtype=torch.float32, miss_path="stream"
    )
    assert lm.cache.every_layer_resident()
    assert not lm.runtime.streams(1)  # the all-resident single wave, no record to read
    lm.target.forward(random_prompt(3, lm.config.vocab_size, seed=1), 0)
    assert lm.cache.stats()["total"]["acquires"] == 0


def test_staging_keeps_the_bits_and_the_bytes(checkpoints, arch_name):
    # Staged experts are copied into the staging buffer, then read there: the logits, the
    # record and the bytes are plain streaming's.
    folder = checkpoints[arch_name]
    ids = random_prompt(7, 96, seed=5)
    runs = {}
    for staging in (0, 2):
        lm = load_model(
            folder, device="cpu", dtype=torch.float16, slots_per_layer=2, batch_invariant=True,
            miss_path="stream", stream_staging=staging,
        )  # fmt: skip
        assert lm.stream_staging == staging
        first = lm.target.forward(ids[:, :4], 0)
        lm.runtime.record_routing()  # the second forward's routed experts (a sync per layer)
        second = lm.target.forward(ids[:, 4:], 4)
        runs[staging] = (first, second, lm.cache.stats()["total"], lm)
    assert torch.equal(runs[2][0], runs[0][0])
    assert torch.equal(runs[2][1], runs[0][1])
    for key in (
        "streamed_reads",
        "streamed_bytes",
        "bytes_moved",
        "hits",
        "misses",
        "streamed_histogram",
    ):
        assert runs[2][2][key] == runs[0][2][key], key
    lm = runs[2][3]
    staging = lm.runtime.staging
    assert staging.num_slots == 2
    assert lm.memory.plan.staging_slots == 2
    # The last layer's staging: its first two routed experts that held no slot.
    last = lm.cache.num_layers - 1
    routed = sorted(set(lm.runtime.routing_trace[last][0]))
    resident = set(lm.cache.resident_experts(last))
    missing = [e for e in routed if e not in resident]
    assert missing
    assert staging.staged_experts.tolist() == [*missing, -1, -1][:2]
    for slot, expert in enumerate(staging.staged_experts.tolist()):
        if expert >= 0:
            gate_up, down = staging.slot_weights(slot)
            assert torch.equal(gate_up, lm.cache.store.get(last, expert)["gate_up"])
            assert torch.equal(down, lm.cache.store.get(last, expert)["down"])


def test_greedy_speculation_with_staging_keeps_the_tokens(checkpoints):
    from specter_spec import SpecController

    folder = checkpoints["tiny-deepseek-v2"]
    tokens = {}
    for staging in (0, 3):
        lm = load_model(
            folder, device="cpu", dtype=torch.float16, slots_per_layer=3, batch_invariant=True,
            miss_path="stream", stream_staging=staging,
        )  # fmt: skip
        prompt = random_prompt(6, lm.config.vocab_size, seed=44)[0].tolist()
        spec = SpecController(lm.draft, lm.target, cache=lm.prefetcher, depth=4)
        tokens[staging] = spec.generate(prompt, 12).tokens
        assert lm.cache.stats()["total"]["streamed_reads"] > 0
    assert tokens[3] == tokens[0]


def test_bad_stream_staging_is_refused(checkpoints):
    folder = checkpoints["tiny-qwen2-moe"]
    with pytest.raises(ValueError, match=r"stream_staging must be an int >= 0.*-1"):
        load_model(folder, device="cpu", dtype=torch.float16, stream_staging=-1)
    with pytest.raises(ValueError, match=r"stream_staging=2 needs dtype=torch.float16.*float32"):
        load_model(folder, device="cpu", dtype=torch.float32, stream_staging=2)
    lm = load_model(
        folder, device="cpu", dtype=torch.float16, slots_per_layer=2, miss_path="stream",
        stream_staging=2,
    )  # fmt: skip
    lm.stream_staging = 1  # narrower: a view of the same buffer
    assert lm.runtime.staging_buffer().num_slots == 1
    assert lm.runtime.staging_buffer().weights.data_ptr() == lm.runtime.staging.weights.data_ptr()
    lm.stream_staging = 0
    assert lm.runtime.staging_buffer() is None
    with pytest.raises(ValueError, match=r"stream_staging=3 is above this model's staging buffer"):
        lm.stream_staging = 3


def _speculate_with_counts(folder, prompt, deferred: bool, sampled: bool = False):
    """Speculation (greedy, or sampled at T = 1 with a seeded generator) on the streamed
    path with fills, every count made at once or deferred (the stream record's and the
    prefetcher's closing): tokens, the cache's and the prefetcher's counters, and the counts
    queued at each draft's first token."""
    from specter_spec import SamplingConfig, SpecController

    lm = load_model(
        folder, device="cpu", dtype=torch.float64, slots_per_layer=3, miss_path="stream",
        stream_fills=2,
    )  # fmt: skip
    lm.runtime.stream_record.deferred = deferred
    lm.prefetcher.deferred_close = deferred
    queued: list[int] = []
    on_draft_token = lm.prefetcher.on_draft_token

    def watched(index):
        if index == 0:  # a draft's first token: the last verification's counts may wait
            queued.append(lm.cache.counts_pending)
        on_draft_token(index)
        assert lm.cache.counts_pending == 0  # every count is made before a boundary plans

    lm.prefetcher.on_draft_token = watched
    sampling = SamplingConfig(temperature=1.0) if sampled else None
    controller = SpecController(
        lm.draft, lm.target, cache=lm.prefetcher, depth=3, sampling=sampling
    )
    generator = torch.Generator().manual_seed(11) if sampled else None
    result = controller.generate(prompt[0].tolist(), max_new_tokens=16, generator=generator)
    prefetcher = lm.prefetcher.stats()
    cache = prefetcher.pop("cache")
    for timing in ("bandwidth_bytes_per_s", "draft_token_seconds"):
        prefetcher.pop(timing)
    return result.tokens, cache, prefetcher, queued


def test_deferred_counts_change_no_token_decision_or_statistic(checkpoints, arch_name):
    folder = checkpoints[arch_name]
    prompt = random_prompt(6, 96, seed=17)
    now = _speculate_with_counts(folder, prompt, deferred=False)
    later = _speculate_with_counts(folder, prompt, deferred=True)
    assert later[0] == now[0]  # tokens
    assert later[1] == now[1]  # the cache's counters, per layer and in total (fills too)
    assert later[2] == now[2]  # the prefetcher's plan scores, accepted tokens
    assert now[1]["total"]["streamed_reads"] > 0
    assert now[1]["total"]["streamed_fills"] > 0
    # Deferred, each forward's record (and a verification's closing) waits for the next
    # draft token: at the first, the streamed prefill's record; later, a verification's
    # record and its closing.
    assert set(now[3]) == {0}
    assert later[3][0] == 1
    assert set(later[3][1:]) == {2}


def test_back_to_back_forwards_settle_a_deferred_record_before_the_next_fills(checkpoints):
    folder = checkpoints["tiny-deepseek-v2"]
    ids = random_prompt(9, 96, seed=23)
    out = []
    for deferred in (False, True):
        lm = load_model(
            folder, device="cpu", dtype=torch.float64, slots_per_layer=3, miss_path="stream",
            stream_fills=2,
        )  # fmt: skip
        lm.runtime.stream_record.deferred = deferred
        logits = [lm.target.forward(ids[:, :4], 0)]
        assert lm.cache.counts_pending == int(deferred)
        # The next forward's fills pick candidate slots by the policy: after the count.
        logits.append(lm.target.forward(ids[:, 4:], 4))
        out.append((logits, lm.cache.stats(), _slot_states(lm)))
    assert all(torch.equal(a, b) for a, b in zip(out[0][0], out[1][0], strict=True))
    assert out[1][1] == out[0][1]
    assert out[1][2] == out[0][2]
    assert out[0][1]["total"]["streamed_fills"] > 0


def test_deferred_counts_keep_sampled_tokens_for_one_seed(checkpoints):
    folder = checkpoints["tiny-qwen2-moe"]
    prompt = random_prompt(6, 96, seed=19)
    now = _speculate_with_counts(folder, prompt, deferred=False, sampled=True)
    later = _speculate_with_counts(folder, prompt, deferred=True, sampled=True)
    assert later[:3] == now[:3]  # tokens, the cache's and the prefetcher's counters
    assert now[2]["accepted_tokens"] < now[2]["draft_tokens"]  # some proposals rejected


def test_held_prefetch_copies_go_out_after_the_verification_launch(checkpoints, arch_name):
    # SpeculativePrefetcher(verify_lead=0): every data copy of a verification's plan waits
    # for the streamed target's launch. On the CPU the forward then runs before them, so
    # the held experts are streamed: more streamed reads, the same tokens.
    from specter_spec import SpecController

    folder = checkpoints[arch_name]
    prompt = random_prompt(6, 96, seed=29)[0].tolist()
    runs = {}
    for lead in (None, 0):
        lm = load_model(
            folder, device="cpu", dtype=torch.float64, slots_per_layer=3, miss_path="stream"
        )
        lm.prefetcher.verify_lead = lead
        lm.prefetcher.pipelined = True  # as on CUDA: the last snapshot plans at the launch
        held: list[tuple[int, int]] = []
        forward = lm.target.forward

        def watched(ids, start, lm=lm, held=held, forward=forward):
            before = lm.cache.copies_held
            logits = forward(ids, start)
            held.append((before, lm.cache.copies_held))
            return logits

        lm.target.forward = watched
        # K = 1, as the adaptive depth picks at DeepSeek's 24 GB: every plan is made at a
        # verification's start.
        controller = SpecController(lm.draft, lm.target, cache=lm.prefetcher, depth=1)
        tokens = controller.generate(prompt, max_new_tokens=16).tokens
        runs[lead] = (tokens, held, lm.cache.stats()["total"])
    plain_lm = load_model(folder, device="cpu", dtype=torch.float64, slots_per_layer=3)
    plain = SpecController(None, plain_lm.target, depth=0).generate(prompt, max_new_tokens=16)
    assert runs[0][0] == runs[None][0] == plain.tokens
    assert max(before for before, _ in runs[0][1]) > 0  # held at the launch
    assert {before for before, _ in runs[None][1]} == {0}
    assert {after for _, after in runs[0][1]} == {0}  # released by the forward
    assert runs[0][2]["prefetch_loads"] == runs[None][2]["prefetch_loads"] > 0
    assert runs[0][2]["streamed_reads"] > runs[None][2]["streamed_reads"]


class _QueuedPlainSteps:
    """A speculation observer with no cache work of its own that lets the controller queue
    plain steps one ahead (as specter-bench's ``DecodeWindow(streamed_plain=True)``)."""

    def on_draft_start(self, depth):
        pass

    def on_draft_token(self, index):
        pass

    def on_verify_start(self, num_tokens):
        pass

    def on_verify_end(self, num_accepted):
        pass

    def plain_steps_may_overlap(self):
        return True


def _plain_streamed_decode(folder, prompt, *, pipelined: bool):
    """Plain decoding on the streamed path with fills and deferred counts: tokens, the
    counts still queued right after each step's candidate choice, each step's offered slots
    per layer, the cache's counters, and whether the device maps match the host's."""
    from specter_spec import SpecController

    lm = load_model(
        folder, device="cpu", dtype=torch.float64, slots_per_layer=3, miss_path="stream",
        stream_fills=2, draft=None,
    )  # fmt: skip
    record = lm.runtime.stream_record
    record.deferred = True
    record.pipelined = pipelined
    queued, offered = [], []
    prepare = lm.cache.streamed.prepare_fills

    def watched(*args, **kwargs):
        slots, experts, claimed = prepare(*args, **kwargs)
        queued.append(lm.cache.counts_pending)
        offered.append([{s for s in row if s >= 0} for row in slots.tolist()])
        return slots, experts, claimed

    lm.cache.streamed.prepare_fills = watched
    controller = SpecController(None, lm.target, cache=_QueuedPlainSteps(), depth=0)
    tokens = controller.generate(prompt[0].tolist(), max_new_tokens=24).tokens
    lm.cache.settle()
    maps_agree = all(
        lm.cache.expert_to_slot(layer).tolist()
        == [
            -1 if lm.cache.slot_of(layer, e) is None else lm.cache.slot_of(layer, e)
            for e in range(lm.cache.num_experts)
        ]
        for layer in range(lm.cache.num_layers)
    )
    return tokens, queued, offered, lm.cache.stats()["total"], maps_agree


def test_pipelined_plain_streamed_steps_keep_tokens_without_waiting_for_the_last_count(
    checkpoints, arch_name
):
    # Pipelined, a plain step's fill candidates are chosen while the step before it is
    # still to count, among slots that step was not offered: the same tokens as counting
    # first (and as acquiring), fills still made, the device map the host's in the end.
    folder = checkpoints[arch_name]
    prompt = random_prompt(7, 96, seed=29)
    first, queued_first, _, _, agree_first = _plain_streamed_decode(folder, prompt, pipelined=False)
    piped, queued_piped, offered, stats_piped, agree_piped = _plain_streamed_decode(
        folder, prompt, pipelined=True
    )
    from specter_spec import SpecController

    acquired = load_model(folder, device="cpu", dtype=torch.float64, slots_per_layer=3, draft=None)
    assert (
        piped
        == first
        == SpecController(None, acquired.target, depth=0)
        .generate(prompt[0].tolist(), max_new_tokens=24)
        .tokens
    )
    assert set(queued_first) == {0}  # counting first: nothing queued at a candidate choice
    assert set(queued_piped[1:]) == {1}  # pipelined: the step before is still to count
    for before, after in itertools.pairwise(offered):  # consecutive offers
        assert all(not (a & b) for a, b in zip(before, after, strict=True))
    assert stats_piped["streamed_fills"] > 0
    assert stats_piped["streamed_reads"] > 0
    assert agree_first
    assert agree_piped


def test_a_pipelined_step_fills_no_expert_the_uncounted_step_before_it_filled(checkpoints):
    # Two back-to-back forwards routing to the same missing experts: the first fills them;
    # the second, launched before the first is counted, must read them from their slots and
    # fill none of them again (they are claimed from the device map).
    folder = checkpoints["tiny-deepseek-v2"]
    lm = load_model(
        folder, device="cpu", dtype=torch.float64, slots_per_layer=3, miss_path="stream",
        stream_fills=2, draft=None,
    )  # fmt: skip
    record = lm.runtime.stream_record
    record.deferred = record.pipelined = True
    ids = random_prompt(9, 96, seed=31)
    first = lm.target.forward(ids[:, :1], 0)
    lm.target.truncate(0)
    assert lm.cache.counts_pending == 1
    again = lm.target.forward(ids[:, :1], 0)  # the same token at the same position
    assert torch.equal(again, first)
    assert lm.cache.counts_pending == 1  # the first forward's count ran after this launch
    lm.cache.settle()
    total = lm.cache.stats()["total"]
    assert total["streamed_fills"] > 0
    for layer in range(lm.cache.num_layers):  # one slot per filled expert, maps agree
        host = [lm.cache.slot_of(layer, e) for e in range(lm.cache.num_experts)]
        device = lm.cache.expert_to_slot(layer).tolist()
        assert device == [-1 if s is None else s for s in host]
    with pytest.raises(ValueError, match="exclude needs one collection of slots per layer"):
        lm.cache.streamed.prepare_fills(2, exclude=[()])
