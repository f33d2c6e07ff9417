"""``specter serve --measure``'s comparison of direct and served decoding."""

from __future__ import annotations

import math

from serve.conftest import MODEL
from serve.fake_engine import FakeEngine
from specter_bench.serve.measure import measure_overhead


def test_both_arms_decode_the_same_text_and_are_timed(start_server):
    server = start_server(FakeEngine("some text ", step_s=0.005, eos_at=7))
    result = measure_overhead(server, MODEL, ["a", "bb"], 10)
    assert result["same_text"]
    assert len(result["per_prompt"]) == 2
    for arm in (result["direct"], result["server"]):
        assert arm.tokens == 2 * 8  # seven tokens and the EOS, each prompt
        assert arm.ttft_ms_mean > 0
        assert arm.tpot_ms_mean > 0
    assert math.isfinite(result["tpot_overhead_pct"])
    assert math.isfinite(result["ttft_overhead_ms"])
    assert math.isfinite(result["tpot_overhead_pct_median"])
    assert math.isfinite(result["ttft_overhead_ms_median"])
    # The arms take turns going first, so neither always pays a prompt's first-time costs.
    assert [row["first"] for row in result["per_prompt"]] == ["direct", "server"]
