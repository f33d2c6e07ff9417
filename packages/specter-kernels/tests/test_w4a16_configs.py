"""The W4A16 kernels' tile choices and the gemv math switch (``SPECTER_W4A16_MATH``)."""

import pytest
import torch

from specter_kernels import w4a16_configs


@pytest.mark.parametrize(("value", "math"), [(None, 3), ("3", 3), ("0", 0)])
def test_gemv_math_comes_from_the_variable(monkeypatch, value, math):
    if value is None:
        monkeypatch.delenv(w4a16_configs.MATH_ENV, raising=False)
    else:
        monkeypatch.setenv(w4a16_configs.MATH_ENV, value)
    assert w4a16_configs._gemv_math() == math


@pytest.mark.parametrize("value", ["1", "2", "packed", ""])
def test_a_bad_gemv_math_names_the_value(monkeypatch, value):
    monkeypatch.setenv(w4a16_configs.MATH_ENV, value)
    with pytest.raises(ValueError, match=f"SPECTER_W4A16_MATH={value!r}: expected 0"):
        w4a16_configs._gemv_math()


@pytest.mark.parametrize(("H", "I"), [(2048, 1408), (4096, 6400), (64, 96)])
def test_cuda_gemv_configs_use_the_math_and_cover_k(monkeypatch, H, I):
    monkeypatch.setattr(w4a16_configs, "GEMV_MATH", 0)
    gate_up, down = w4a16_configs.gemv_configs(torch.device("cuda"), 1, 6, H, I)
    assert (gate_up.math, down.math) == (0, 0)
    monkeypatch.setattr(w4a16_configs, "GEMV_MATH", 3)
    gate_up, down = w4a16_configs.gemv_configs(torch.device("cuda"), 1, 6, H, I)
    assert (gate_up.math, down.math) == (3, 3)
    # down's K (= I) is split at most into as many 128-input stretches as it has
    assert 1 <= down.split_k <= -(-I // down.block_k)
    # the interpreter's configs keep the fp16 math whatever the variable says
    cpu_gate_up, cpu_down = w4a16_configs.gemv_configs(torch.device("cpu"), 1, 6, H, I)
    assert (cpu_gate_up.math, cpu_down.math) == (0, 0)
