"""The W4A16 kernels' tile choices and the gemv path's math."""

import pytest
import torch

from specter_kernels.moe import w4a16_configs


@pytest.mark.parametrize(("H", "I"), [(2048, 1408), (4096, 6400), (64, 96)])
def test_cuda_gemv_configs_use_the_packed_math_and_cover_k(H, I):
    gate_up, down = w4a16_configs.gemv_configs(torch.device("cuda"), 1, 6, H, I)
    assert (gate_up.math, down.math) == (3, 3)
    # down's K (= I) is split at most into as many 128-input stretches as it has
    assert 1 <= down.split_k <= -(-I // down.block_k)
    # the interpreter's configs keep the fp16 math
    cpu_gate_up, cpu_down = w4a16_configs.gemv_configs(torch.device("cpu"), 1, 6, H, I)
    assert (cpu_gate_up.math, cpu_down.math) == (0, 0)


def test_the_tuning_candidates_start_with_the_defaults_and_use_the_packed_math():
    for I in (1408, 6400, 96):
        gate_up, down = w4a16_configs.default_gemv_configs(I)
        gate_ups = w4a16_configs.gemv_gate_up_candidates()
        downs = w4a16_configs.gemv_down_candidates(I)
        assert (gate_ups[0], downs[0]) == (gate_up, down)
        assert len(set(gate_ups)) == len(gate_ups) > 1
        assert len(set(downs)) == len(downs) > 1
        assert {c.math for c in gate_ups + downs} == {w4a16_configs.GEMV_MATH}
        assert all(c.block_k % 8 == 0 for c in gate_ups + downs)
