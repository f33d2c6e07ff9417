"""CPU test mode: Triton kernels run under the interpreter on the CPU.

TRITON_INTERPRET must be set before triton is first imported, so it is set here,
at conftest import time, before any test module imports specter_kernels.

Inputs are fresh random draws on every run: each test gets its own seed, printed
in the failure report and replayable with ``SPECTER_TEST_SEED=<seed>``.
"""

import os
import secrets

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest
import torch


def _patch_interpreter_for_numpy_2_4() -> None:
    """Let Triton 3.6's interpreter use runtime scalars as loop bounds under numpy >= 2.4.

    The interpreter holds scalars as 1-element arrays and turns them into Python
    ints with ``int(array)``, which numpy 2.4 no longer allows for arrays with a
    dimension (``range(0, K, BLOCK)`` then fails). Take the single element instead.
    """
    try:
        import triton.runtime.interpreter as interpreter
    except ImportError:  # no triton: the triton tests skip themselves
        return
    original = interpreter._patch_lang_tensor
    if getattr(original, "_specter_patched", False):
        return

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._specter_patched = True
    interpreter._patch_lang_tensor = patched


def _patch_interpreter_dot_row_by_row() -> None:
    """Make the interpreter's float32/float64 ``tl.dot`` give each output row the same bits
    wherever that row sits in its tile.

    The interpreter multiplies a whole tile with ``np.matmul``, which hands float32/float64
    to OpenBLAS; its kernels round a row differently by the row's position in the tile on
    some CPUs (AVX2's Haswell kernels: a query row at tile position 9 against position 1),
    so the batch-invariance tests failed on such machines although the kernels are row
    invariant (on the GPU every element of a tile is computed the same way). One BLAS call
    per row removes the dependence on position. fp16 dots are numpy's own loop and stay.
    """
    try:
        import numpy as np
        import triton.runtime.interpreter as interpreter
    except ImportError:
        return
    builder = interpreter.InterpreterBuilder
    original = builder.create_dot
    if getattr(original, "_specter_patched", False):
        return

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if a.data.dtype not in (np.float32, np.float64) or a.data.ndim < 2:
            return original(self, a, b, d, input_precision, max_num_imprecise_acc)
        rows = [
            np.matmul(a.data[..., i : i + 1, :], b.data, dtype=d.data.dtype)
            for i in range(a.data.shape[-2])
        ]
        return interpreter.TensorHandle(np.concatenate(rows, axis=-2) + d.data, d.dtype.scalar)

    create_dot._specter_patched = True
    builder.create_dot = create_dot


_patch_interpreter_for_numpy_2_4()
_patch_interpreter_dot_row_by_row()


@pytest.fixture
def seed(request) -> int:
    """A fresh seed per test (or SPECTER_TEST_SEED), reported with the test's outcome."""
    value = int(os.environ.get("SPECTER_TEST_SEED", secrets.randbits(31)))
    request.node.user_properties.append(("seed", value))
    torch.manual_seed(value)
    return value


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    seeds = [v for k, v in item.user_properties if k == "seed"]
    if report.failed and seeds:
        report.sections.append(("seed", f"SPECTER_TEST_SEED={seeds[0]} reproduces this run"))


def _skip_without_interpreter() -> None:
    """These tests feed CPU tensors: Triton runs them only under its interpreter (CI sets
    ``TRITON_INTERPRET=1``; a GPU machine running its CUDA tests may not)."""
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("CPU-tensor Triton tests need TRITON_INTERPRET=1 set before triton loads")


@pytest.fixture
def triton_backend(monkeypatch):
    """Force the Triton kernels (interpreted on the CPU)."""
    _skip_without_interpreter()
    monkeypatch.setenv("SPECTER_KERNELS_BACKEND", "triton")


@pytest.fixture
def exact_bf16(monkeypatch, triton_backend):
    """The Triton backend with the interpreter's bf16 <-> fp32 casts made the GPU's: fp32 to
    bf16 rounded to nearest even (``cvt.rn.bf16.f32``; the interpreter truncates) and bf16
    subnormals widened exactly (the interpreter's are off)."""
    import numpy as np
    import triton.language as tl
    import triton.runtime.interpreter as interpreter

    interpreters = interpreter._convert_float

    def convert(data, input_dtype, output_dtype, rounding_mode):
        if input_dtype == tl.bfloat16 and output_dtype == tl.float32:
            return data.view(np.uint16).astype(np.uint32) << 16
        if input_dtype == tl.float32 and output_dtype == tl.bfloat16 and rounding_mode is None:
            bits = data.view(np.uint32).astype(np.uint64)
            nearest_even = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
            quiet_nan = (bits >> 16) | 0x40
            return np.where(np.isnan(data), quiet_nan, nearest_even).astype(np.uint16)
        return interpreters(data, input_dtype, output_dtype, rounding_mode)

    monkeypatch.setattr(interpreter, "_convert_float", convert)


class PoisonedTorch:
    """``torch`` with ``empty`` returning poison (NaN floats, -777 ints).

    Patched into the kernel launch modules so that any element a kernel should
    write but does not shows up as NaN (or a wild index) in the result.
    """

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def empty(*args, **kwargs):
        tensor = torch.empty(*args, **kwargs)
        if tensor.is_floating_point():
            return tensor.fill_(float("nan"))
        return tensor.fill_(-777)


@pytest.fixture
def poisoned(monkeypatch, triton_backend):
    """Triton backend with poisoned intermediate and output buffers."""
    from specter_kernels.attention import mla_attention_triton
    from specter_kernels.invariant import matmul_triton
    from specter_kernels.moe import (
        align_triton,
        grouped_fp16_triton,
        join_norm_triton,
        routed_pair_sum_triton,
        router_topk_triton,
        w4a16_triton,
    )
    from specter_kernels.sampling import argmax_triton
    from specter_kernels.streaming import fills_triton, staging_triton

    for module in (
        argmax_triton,
        w4a16_triton,
        grouped_fp16_triton,
        align_triton,
        matmul_triton,
        join_norm_triton,
        router_topk_triton,
        mla_attention_triton,
        routed_pair_sum_triton,
        fills_triton,
        staging_triton,
    ):
        monkeypatch.setattr(module, "torch", PoisonedTorch())


@pytest.fixture(params=["torch", "triton"])
def backend(request, monkeypatch):
    """Runs a test on the torch reference and on the Triton kernel (interpreted on the CPU)."""
    if request.param == "triton":
        _skip_without_interpreter()
    monkeypatch.setenv("SPECTER_KERNELS_BACKEND", request.param)
    return request.param
