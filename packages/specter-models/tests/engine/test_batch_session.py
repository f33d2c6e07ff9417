"""Engine.batch_session: sequences join and leave at step boundaries and each decodes what it
decodes alone; a full batch, a cancel and a busy engine are handled clearly."""

import pytest

from specter_models import (
    BatchConfig,
    Engine,
    EngineConfig,
    KernelConfig,
    LoadConfig,
    MemoryConfig,
    SpeculationConfig,
)
from specter_spec import BatchFullError

PROMPTS = [[5, 17, 42, 8, 23, 11], [3, 4], [9, 9, 1, 4, 6, 7, 8, 1, 2], [60, 61, 62]]


@pytest.fixture(scope="module")
def engine():
    config = EngineConfig(
        LoadConfig("tiny-phimoe", device="cpu", dtype="float64", weights_seed=2),
        MemoryConfig(slots_per_layer=3, max_seq_len=96),
        KernelConfig(),
        SpeculationConfig(depth=3, depth_memory=False),
        batch=BatchConfig(max_batch=2),
    )
    built = Engine.from_config(config, calibration_prompt=PROMPTS[0])
    built.expected = [
        built.generate(p, max_new_tokens=14, stop_token_ids=[]).result().token_ids for p in PROMPTS
    ]
    return built


def _drain(session, seen):
    while session.active:
        for chunk in session.step():
            seen.setdefault(chunk.index, []).extend(chunk.token_ids)


def test_sequences_join_as_slots_free_up_and_decode_as_alone(engine):
    session = engine.batch_session()
    assert session.max_batch == 2
    first = session.add(PROMPTS[0], max_new_tokens=14, stop_token_ids=[])
    short = session.add(PROMPTS[1], max_new_tokens=3, stop_token_ids=[])
    with pytest.raises(BatchFullError, match="all 2 slots hold active sequences"):
        session.add(PROMPTS[2], max_new_tokens=14)
    seen: dict[int, list[int]] = {}
    while session.active == 2:
        for chunk in session.step():
            seen.setdefault(chunk.index, []).extend(chunk.token_ids)
    joined = session.add(PROMPTS[2], max_new_tokens=14, stop_token_ids=[])  # mid-run
    _drain(session, seen)
    assert seen[short] == engine.expected[1][:3]
    assert seen[first] == session.token_ids(first) == engine.expected[0]
    assert seen[joined] == engine.expected[2]
    assert session.stats(joined)["stop_reason"] == "max_new_tokens"
    assert session.stats(short)["new_tokens"] == 3
    stats = session.batch_stats()
    assert stats["sequences"] == 3
    assert stats["tokens_out"] == 14 + 3 + 14


def test_a_cancelled_sequence_leaves_and_its_slot_serves_the_next(engine):
    session = engine.batch_session()
    kept = session.add(PROMPTS[0], max_new_tokens=14, stop_token_ids=[])
    cancelled = session.add(PROMPTS[1], max_new_tokens=14, stop_token_ids=[])
    session.step()
    before = session.token_ids(cancelled)
    session.cancel(cancelled)
    chunks = session.step()
    leaving = [c for c in chunks if c.index == cancelled]
    assert [(c.token_ids, c.finished, c.finish_reason) for c in leaving] == [
        ([], True, "cancelled")
    ]
    assert session.token_ids(cancelled) == before
    assert session.active == 1
    joined = session.add(PROMPTS[3], max_new_tokens=14, stop_token_ids=[])
    seen: dict[int, list[int]] = {}
    _drain(session, seen)
    assert session.token_ids(kept) == engine.expected[0]
    assert session.token_ids(joined) == engine.expected[3]
    with pytest.raises(KeyError, match="no sequence 9"):
        session.cancel(9)


def test_a_busy_engine_refuses_another_decode_until_the_session_is_done(engine):
    session = engine.batch_session()
    seq = session.add(PROMPTS[1], max_new_tokens=4)
    with pytest.raises(RuntimeError, match="a batch session is decoding 1 sequences"):
        engine.generate(PROMPTS[0], max_new_tokens=4)
    with pytest.raises(RuntimeError, match="a batch session is decoding"):
        engine.batch_session()
    session.cancel(seq)
    session.step()
    alone = engine.generate(PROMPTS[0], max_new_tokens=14, stop_token_ids=[]).result()
    assert alone.token_ids == engine.expected[0]
