"""The invariant GEMV's and matmul's tunings at one tiny shape on the CPU, with torch
launchers standing in for the kernels and a fake timer: a wrong or batch-variant tile is
refused before it is timed and never wins, however fast; the best passed tile becomes the
tuned entry, which reads back as that tile."""

import pytest
import torch

import specter_kernels.invariant.gemv_config as gc
import specter_kernels.invariant.matmul_config as mc
from specter_bench.tuning.invariant_sweeps import ROWS, tune_gemv_shape, tune_matmul_shape
from specter_bench.tuning.linear_shapes import LinearShape
from specter_kernels.invariant.gemv_config import InvariantGemvConfig
from specter_kernels.invariant.matmul_config import BLOCK_M, MatmulConfig
from specter_kernels.tuned_files import write_tuned_file

SHAPE = LinearShape("tiny", 24, 64, torch.float16)
WRONG = InvariantGemvConfig(4, 1, 1)  # off by a lot
VARIANT = InvariantGemvConfig(4, 1, 2)  # row 0 depends on the row count
BROKEN = InvariantGemvConfig(4, 1, 4)  # does not compile
GOOD = InvariantGemvConfig(8, 2, 1)


def _rows(x, weight):
    """Each row's float64 product, rounded once: batch-invariant and accurate."""
    return torch.stack([x[i].double() @ weight.double().T for i in range(x.shape[0])])


def _fake_gemv(x, weight, out, bias, config):
    M, K = x.shape
    assert weight.shape == (SHAPE.N, K)
    assert out.shape == (M, SHAPE.N)
    assert bias is None
    result = _rows(x, weight)
    if config == WRONG:
        result = result + 0.5
    if config == VARIANT:
        result = result * (1 + 1e-2 * M)
    if config == BROKEN:
        raise RuntimeError("out of resources")
    return out.copy_(result)


def _fake_mma(a, b, out, bias=None, config=None):
    assert a.shape[0] == b.shape[0] == out.shape[0] == 1
    assert isinstance(config, MatmulConfig)
    return out.copy_(_rows(a[0], b[0].T)[None])


def _timer(times, default=10.0):
    timed = []

    def timer(launch):
        timed.append(launch.candidate)
        return times.get((launch.candidate, launch.label), default)

    timer.timed = timed
    return timer


def test_candidates_cover_the_space_under_test():
    found = gc.gemv_candidates(SHAPE.N, SHAPE.K, SHAPE.dtype)
    assert {WRONG, VARIANT, BROKEN, GOOD} <= set(found)


@pytest.mark.parametrize(("mma_us", "kernel"), [(5.0, "gemv"), (1.0, "mma")])
def test_the_gemv_tuning_refuses_wrong_tiles_and_weighs_the_gemv_against_the_mma(
    tmp_path, monkeypatch, mma_us, kernel
):
    mma_tile = mc.matmul_config(SHAPE.N, SHAPE.K, SHAPE.dtype)
    times = {(c, f"m{m}"): 0.1 for c in (WRONG, VARIANT, BROKEN) for m in ROWS}
    times |= {(GOOD, "m1"): 1.0, (GOOD, "m5"): 3.0}  # weighted 3 x 1 + 3 = 6
    times |= {(mma_tile, "m1"): mma_us, (mma_tile, "m5"): mma_us}  # weighted 20 or 4
    timer = _timer(times)
    result = tune_gemv_shape(
        SHAPE, "cpu", timer, launch_gemv=_fake_gemv, launch_mma=_fake_mma, graph_bytes=1
    )
    failures = {t.candidate: t.failure for t in result.trials}
    assert "relative error" in failures[WRONG]
    assert "not batch-invariant" in failures[VARIANT]
    assert failures[BROKEN] == "RuntimeError: out of resources"
    assert {WRONG, VARIANT, BROKEN}.isdisjoint(timer.timed)
    assert "cuBLAS" in timer.timed  # the reference time is taken too
    assert result.best.candidate == GOOD
    assert result.baselines[0].candidate == mma_tile
    assert result.entry["kernel"] == kernel
    assert result.entry["gemv_graph_us_m5"] == 3.0
    assert result.entry["mma_graph_us_m1"] == mma_us
    # the entry reads back through gemv_config as the chosen kernel
    monkeypatch.setattr(gc, "TUNED_DIR", tmp_path)
    write_tuned_file(gc.tuned_gemv_path("Fake GPU"), "Fake GPU", [result.entry],
                     key_fields=mc.KEY_FIELDS, source="test")  # fmt: skip
    expected = GOOD if kernel == "gemv" else None
    assert gc.gemv_config(SHAPE.N, SHAPE.K, SHAPE.dtype, "Fake GPU") == expected


def test_a_shape_without_a_correct_gemv_tile_goes_to_the_mma():
    def all_wrong(x, weight, out, bias, config):
        return out.copy_(_rows(x, weight) + 1)

    result = tune_gemv_shape(
        SHAPE, "cpu", _timer({}), launch_gemv=all_wrong, launch_mma=_fake_mma, graph_bytes=1
    )
    assert result.best is None
    assert not any(t.passed for t in result.trials)
    assert result.entry["kernel"] == "mma"


def test_a_shape_the_gemv_cannot_take_is_refused():
    with pytest.raises(ValueError, match="multiple of 8"):
        tune_gemv_shape(LinearShape("odd", 8, 12, torch.float16), "cpu", _timer({}))


def test_the_matmul_tuning_picks_the_least_one_plus_five_row_time(tmp_path, monkeypatch):
    candidates = mc.matmul_candidates(SHAPE.N, SHAPE.K, SHAPE.dtype)
    wrong, good = candidates[1], candidates[2]

    def launch(a, b, out, bias=None, config=None):
        _fake_mma(a, b, out, bias, config)
        return out.add_(1) if config == wrong else out

    times = {(wrong, "m1"): 0.1, (wrong, "m5"): 0.1, (good, "m1"): 2.0, (good, "m5"): 2.5}
    timer = _timer(times)
    result = tune_matmul_shape(SHAPE, "cpu", timer, launch_mma=launch, graph_bytes=1)
    assert [t.candidate for t in result.trials] == candidates
    assert wrong not in timer.timed
    assert result.best.candidate == good
    entry = result.entry
    assert (entry["graph_us_m1"], entry["graph_us_m5"], entry["linear_graph_us_m1"]) == (
        2.0,
        2.5,
        10.0,
    )
    monkeypatch.setattr(mc, "TUNED_DIR", tmp_path)
    write_tuned_file(mc.tuned_config_path("Fake GPU"), "Fake GPU", [entry],
                     key_fields=mc.KEY_FIELDS, source="test")  # fmt: skip
    assert mc.matmul_config(SHAPE.N, SHAPE.K, SHAPE.dtype, "Fake GPU") == good
    assert good.block_m == BLOCK_M
