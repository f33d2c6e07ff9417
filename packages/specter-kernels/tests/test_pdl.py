"""Programmatic dependent launch: when it is used, and that it changes no bits on the GPU."""

import pytest
import torch

import specter_kernels as sk
from specter_kernels import pdl


@pytest.fixture(autouse=True)
def _fresh_settings():
    """Each test reads the variables it sets; the next test starts from the real ones."""
    pdl.refresh_pdl_settings()
    yield
    pdl.refresh_pdl_settings()


def test_pdl_is_off_on_the_cpu_and_under_the_interpreter(monkeypatch):
    assert pdl.pdl_options(torch.device("cpu")) == {"PDL": 0}
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    pdl.refresh_pdl_settings()
    assert not pdl.pdl_enabled(torch.device("cuda", 0))  # the interpreter cannot launch PDL


def test_small_kernels_trigger_their_successor_and_the_others_wait(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(pdl, "_capable", lambda index: True)
    cuda = torch.device("cuda", 0)
    pdl.refresh_pdl_settings()
    assert pdl.pdl_options(cuda) == {"PDL": 1, "launch_pdl": True}
    assert pdl.pdl_options(cuda, early_trigger=True) == {"PDL": 2, "launch_pdl": True}
    assert pdl.pdl_options(torch.device("cpu"), early_trigger=True) == {"PDL": 0}
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert pdl.pdl_options(cuda)["PDL"] == 1  # read once: the next launch still compiles
    pdl.refresh_pdl_settings()
    assert pdl.pdl_options(cuda) == {"PDL": 0}
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    pdl.refresh_pdl_settings()
    monkeypatch.setattr(pdl, "_capable", lambda index: False)  # before Hopper
    assert pdl.pdl_options(cuda) == {"PDL": 0}


_RMS_NORM_PTX = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from specter_kernels.norms import rms_norm_triton as rn

signature = {"x_ptr": "*fp16", "w_ptr": "*fp16", "out_ptr": "*fp16", "N": "i32",
             "stride_xr": "i32", "stride_or": "i32", "eps": "fp32", "BLOCK": "constexpr",
             "PDL": "constexpr"}
ptx = {}
for mode in (0, 1, 2):
    src = ASTSource(fn=rn._rms_norm_kernel, signature=signature,
                    constexprs={"BLOCK": 1024, "PDL": mode})
    ptx[mode] = triton.compile(src, target=GPUTarget("cuda", 90, 32)).asm["ptx"]
sys.stdout.write(json.dumps(ptx))
"""


def test_each_mode_compiles_to_its_grid_dependency_instructions():
    """Compiled for an H100/H200 (sm_90), a kernel's PTX holds ``griddepcontrol.wait`` with
    ``PDL`` 1 and 2, ``launch_dependents`` with ``PDL`` 2 only, and neither without PDL.
    Needs no GPU: a subprocess without the interpreter compiles it."""
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", _RMS_NORM_PTX], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    ptx = {int(mode): text for mode, text in json.loads(done.stdout).items()}
    assert "griddepcontrol" not in ptx[0]
    assert "griddepcontrol.wait" in ptx[1]
    assert "griddepcontrol.launch_dependents" not in ptx[1]
    assert "griddepcontrol.wait" in ptx[2]
    assert "griddepcontrol.launch_dependents" in ptx[2]
    # The wait comes before the kernel's first global load.
    assert ptx[1].index("griddepcontrol.wait") < ptx[1].index("ld.global")


_GEMV_PTX = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from specter_kernels.invariant.gemv_triton import _invariant_gemv_kernel

signature = {"x_ptr": "*fp16", "w_ptr": "*fp16", "bias_ptr": "*fp16", "out_ptr": "*fp16",
             "M": "i32", "N": "i32", "K": "i32", "stride_xm": "i32", "stride_wn": "i32",
             "stride_om": "i32", "HAS_BIAS": "constexpr", "BLOCK_N": "constexpr",
             "BLOCK_K": "constexpr", "ROWS": "constexpr", "PRELOAD": "constexpr",
             "PDL": "constexpr"}
aligned = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 3, 6, 8)}
ptx = {}
for preload in (0, 1):
    src = ASTSource(fn=_invariant_gemv_kernel, signature=signature, attrs=aligned,
                    constexprs={"HAS_BIAS": False, "BLOCK_N": 2, "BLOCK_K": 512, "ROWS": 1,
                                "PRELOAD": preload, "PDL": 2})
    ptx[preload] = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                                  options={"num_warps": 1}).asm["ptx"]
sys.stdout.write(json.dumps(ptx))
"""


def test_the_gemv_preload_issues_its_weight_loads_before_the_wait_and_nothing_else():
    """With ``PRELOAD`` the GEMV's weight loads (``BLOCK_N`` x ``BLOCK_K`` fp16 over 32
    threads: 4 vector loads a thread here) come before ``griddepcontrol.wait`` and the
    input row's loads after it; without, every load comes after the wait."""
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", _GEMV_PTX], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    for preload, ptx in json.loads(done.stdout).items():
        lines = ptx.splitlines()
        wait = next(i for i, line in enumerate(lines) if "griddepcontrol.wait" in line)
        loads = [i for i, line in enumerate(lines) if "ld.global" in line]
        before = sum(i < wait for i in loads)
        # 2 rows x 512 fp16 = 2 KB over 32 threads: 4 x 16-byte weight loads a thread; the
        # input row's 512 fp16 over 32 threads: 2 more.
        assert (before, len(loads) - before) == ((4, 2) if preload == "1" else (0, 6)), preload


def _layer(x, norm, w1, w2, constant=False):
    """A decode-layer-like chain of this package's kernels: norm, GEMM, SwiGLU, GEMM (the
    weights promised constant or not: with the promise the GEMVs may preload them)."""
    h = sk.rms_norm(x, norm, 1e-6)
    h = sk.silu_and_mul(sk.invariant_linear(h, w1, constant_weight=constant))
    return sk.invariant_linear(h, w2, constant_weight=constant)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("preload", [False, True])
def test_a_chain_of_kernels_gives_the_same_bits_with_and_without_pdl(seed, monkeypatch, preload):
    monkeypatch.setenv("SPECTER_KERNELS_BACKEND", "auto")
    if not pdl.pdl_enabled(torch.device("cuda")):
        pytest.skip("this GPU or environment does not use PDL")
    H, I = 2048, 1408
    norm = torch.randn(H, device="cuda").half()
    w1 = (torch.randn(2 * I, H, device="cuda") * 0.02).half()
    w2 = (torch.randn(H, I, device="cuda") * 0.02).half()
    x = torch.randn(5, H, device="cuda").half()

    def chain(x):
        for _ in range(8):  # each kernel reads what the one before it wrote
            x = x + _layer(x, norm, w1, w2, constant=preload)
        return x

    def without_pdl(x):
        with pytest.MonkeyPatch.context() as off:
            off.setattr(pdl, "_interpreted", lambda: True)
            return chain(x)

    plain = without_pdl(x)
    assert torch.equal(chain(x), plain)
    static = x.clone()
    chain(static)  # compiled with PDL before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain(static)
    for _ in range(5):
        fresh = torch.randn_like(x)
        static.copy_(fresh)
        graph.replay()
        assert torch.equal(out, without_pdl(fresh))
