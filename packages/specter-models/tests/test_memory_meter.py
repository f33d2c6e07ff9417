"""Peak host memory over a span."""

from __future__ import annotations

import pytest

from specter_models.memory_meter import MemoryMeter, host_rss_bytes


def test_peak_sees_a_temporary_allocation():
    meter = MemoryMeter("cpu")
    meter.start()
    block = bytearray(64 * 2**20)
    block[::4096] = b"x" * len(block[::4096])  # touch every page
    del block
    peaks = meter.stop()
    assert peaks.host_rss_peak >= peaks.host_rss_before + (
        0 if peaks.host_peak_is_lifetime else 60 * 2**20
    )
    assert peaks.gpu_peak_allocated == 0
    assert host_rss_bytes() > 0


def test_stop_before_start_is_an_error():
    with pytest.raises(RuntimeError, match="before start"):
        MemoryMeter().stop()
