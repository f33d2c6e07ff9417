"""The W4A16 gemv path's tuning for a tiny layer on the CPU, with the torch reference
standing in for the kernel and a fake timer: a wrong pair is refused and never wins; the
down stage runs beside the best gate_up; the default pair stays where nothing beats it."""

import specter_kernels.moe.w4a16_configs as wc
from specter_bench.kernel_bench import KernelShape
from specter_bench.tuning.int4_sweep import tune_int4_layer
from specter_kernels import fused_moe_w4a16_reference
from specter_kernels.moe.w4a16_triton import GemvConfig
from specter_kernels.tuned_files import write_tuned_file

SHAPE = KernelShape("tiny", hidden=64, intermediate=32, num_experts=4, top_k=2, group_size=32)
DEFAULT_GATE_UP, DEFAULT_DOWN = wc.default_gemv_configs(SHAPE.intermediate)
FAST_GATE_UP = GemvConfig(16, 256, 1, 2, 3, 3)
WRONG_GATE_UP = GemvConfig(16, 1024, 1, 4, 3, 3)
FAST_DOWN = GemvConfig(16, 128, 8, 4, 2, 3)


def _launch(x, ids, weights, w13, w2, gate_up, down):
    assert x.shape == (1, SHAPE.hidden)
    assert ids.shape == (1, SHAPE.top_k)
    out = fused_moe_w4a16_reference(x, ids, weights, w13, w2)
    return out * 1.1 if gate_up == WRONG_GATE_UP else out


def _timer(times):
    timed = []

    def timer(launch):
        assert launch.label == "layer"
        assert launch.copies == 2
        timed.append(launch.candidate)
        return times.get(launch.candidate, 20.0)

    timer.timed = timed
    return timer


def _tune(times):
    timer = _timer(times)
    result = tune_int4_layer(
        SHAPE,
        "cpu",
        timer,
        launch=_launch,
        gate_up_candidates=[DEFAULT_GATE_UP, FAST_GATE_UP, WRONG_GATE_UP],
        down_candidates=[DEFAULT_DOWN, FAST_DOWN],
        sets=2,
    )
    return result, timer


def test_the_best_pair_is_found_in_two_stages_and_a_wrong_pair_never_wins(tmp_path, monkeypatch):
    times = {
        (WRONG_GATE_UP, DEFAULT_DOWN): 1.0,
        (FAST_GATE_UP, DEFAULT_DOWN): 15.0,
        (FAST_GATE_UP, FAST_DOWN): 12.0,
    }
    result, timer = _tune(times)
    pairs = [t.candidate for t in result.trials]
    assert pairs == [
        (DEFAULT_GATE_UP, DEFAULT_DOWN),
        (FAST_GATE_UP, DEFAULT_DOWN),
        (WRONG_GATE_UP, DEFAULT_DOWN),
        (FAST_GATE_UP, DEFAULT_DOWN),  # the down stage, beside the best gate_up
        (FAST_GATE_UP, FAST_DOWN),
    ]
    assert "relative error" in result.trials[2].failure
    assert (WRONG_GATE_UP, DEFAULT_DOWN) not in timer.timed
    assert result.best.candidate == (FAST_GATE_UP, FAST_DOWN)
    assert result.entry["layer_graph_us"] == 12.0
    assert result.entry["default_layer_graph_us"] == 20.0
    monkeypatch.setattr(wc, "TUNED_DIR", tmp_path)
    write_tuned_file(wc.tuned_gemv_path("Fake GPU"), "Fake GPU", [result.entry],
                     key_fields=wc.KEY_FIELDS, source="test")  # fmt: skip
    tuned = wc.tuned_gemv_configs(SHAPE.hidden, SHAPE.intermediate, SHAPE.top_k, "Fake GPU")
    assert tuned == (FAST_GATE_UP, FAST_DOWN)


def test_the_default_pair_stays_where_nothing_beats_it():
    result, _ = _tune({(DEFAULT_GATE_UP, DEFAULT_DOWN): 5.0})
    assert result.best is result.default
    assert (result.entry["gate_up"], result.entry["down"]) == (
        DEFAULT_GATE_UP.__dict__,
        DEFAULT_DOWN.__dict__,
    )
    assert result.entry["layer_graph_us"] == 5.0
    assert "default_layer_graph_us" in result.entry
