"""HostPauses: garbage collections timed inside its block only."""

import gc

import torch

from specter_bench.host_pauses import HostPauses


def test_collections_inside_the_block_are_counted_and_timed():
    with HostPauses(torch.device("cpu")) as pauses:
        garbage = [[i] for i in range(20000)]
        del garbage
        gc.collect()
        gc.collect(0)
    gc.collect()  # after the block: not counted
    record = pauses.as_dict()
    assert record["gc_collections"][2] == 1
    assert record["gc_collections"][0] >= 1
    assert record["gc_ms"] > 0
    assert record["allocator"] == {}  # no CUDA allocator to watch on the CPU
    assert pauses._on_gc not in gc.callbacks


def test_a_block_without_collections_records_none():
    enabled = gc.isenabled()
    gc.disable()
    try:
        with HostPauses() as pauses:
            sum(range(1000))
    finally:
        if enabled:
            gc.enable()
    assert pauses.as_dict()["gc_collections"] == [0, 0, 0]
    assert pauses.as_dict()["gc_ms"] == 0.0
