"""What the process costs: time since it started, host memory, the driver's GPU view."""

import time

import pytest
import torch

from specter_bench.resource_meter import (
    DeviceMemory,
    host_memory_bytes,
    process_clock_origin,
    seconds_since_start,
)


def test_time_since_start_counts_from_the_process_start_and_grows():
    first = seconds_since_start()
    assert first > 0  # the interpreter and its imports ran before this test
    time.sleep(0.02)
    assert seconds_since_start() >= first + 0.015
    assert process_clock_origin().startswith("the ")


def test_host_memory_reports_a_resident_set_within_its_peak():
    memory = host_memory_bytes()
    assert memory["peak_rss"] > 10_000_000
    if memory["rss"] is not None:
        assert 0 < memory["rss"] <= memory["peak_rss"] * 1.01


def test_no_driver_view_on_a_cpu():
    meter = DeviceMemory("cpu")
    assert meter.sample() is None
    assert (meter.peak, meter.total) == (None, None)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_driver_view_sees_an_allocation():
    meter = DeviceMemory("cuda")
    before = meter.sample()
    block = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    after = meter.sample()
    assert after >= before + 200 * 2**20
    assert meter.peak == after
    assert meter.total >= after
    del block
