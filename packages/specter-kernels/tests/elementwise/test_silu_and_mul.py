"""silu_and_mul: torch's roundings in one launch, any leading dims and strides, clear errors.

On the GPU the kernel's bits equal torch's (test_gpu.py). Under the CPU interpreter two
things differ from the GPU, and the tests account for both:

* the interpreter's ``exp`` is numpy's, which rounds differently from torch's CPU ``exp``
  in the last fp32 bit for about a third of inputs (the kernel takes libdevice's ``exp`` on
  the GPU, CUDA's own). So the kernel is compared bit for bit with torch's expression
  evaluated with numpy's ``exp`` (every rounding of torch's, in torch's order), and with
  torch's own silu where that rounding cannot show: every bf16 gate, and every fp16 gate
  but the few where the two ``exp``s round the fp16 result differently.
* the interpreter truncates fp32 to bf16 where the GPU rounds to nearest even, and widens
  bf16 subnormals wrongly; the ``exact_bf16`` fixture makes its casts the GPU's.
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import specter_kernels as sk


def _silu_with_numpy_exp(gate: torch.Tensor) -> torch.Tensor:
    """``F.silu``'s arithmetic (fp32, ``g / (1 + exp(-g))``, rounded to the dtype) with
    numpy's ``exp``: the interpreter's."""
    g = gate.float().numpy()
    with np.errstate(over="ignore"):
        silu = g / (np.float32(1) + np.exp(-g))
    return torch.from_numpy(silu).to(gate.dtype)


def _oracle(x: torch.Tensor) -> torch.Tensor:
    """torch's ``F.silu(gate) * up`` rounding by rounding, with numpy's ``exp``."""
    half = x.shape[-1] // 2
    silu = _silu_with_numpy_exp(x[..., :half])
    return (silu.float() * x[..., half:].float()).to(x.dtype)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise: the same bit pattern (so -0 differs from 0), or both NaN (whose payloads
    may differ)."""
    as_int = {2: torch.int16, 4: torch.int32}[a.element_size()]
    return (a.view(as_int) == b.view(as_int)) | (a.isnan() & b.isnan())


DTYPES = [torch.float16, torch.bfloat16, torch.float32]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "shape",
    [(5, 2 * 48), (2, 3, 2 * 37), (2 * 5,), (2, 2 * 1100)],  # 3-d, I not a power of two,
    ids=["2d", "3d", "1d", "two-column-blocks"],  # 1-d, I over one block of columns
)
def test_kernel_makes_torchs_roundings(seed, exact_bf16, dtype, shape):
    x = (3 * torch.randn(shape)).to(dtype)
    out = sk.silu_and_mul(x)
    assert out.shape == (*shape[:-1], shape[-1] // 2)
    assert out.dtype == dtype
    assert out.is_contiguous()
    assert torch.equal(out, _oracle(x))


@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_inputs(seed, exact_bf16, dtype):
    I = 24
    wide = (3 * torch.randn(4, 3 * I)).to(dtype)
    rows = wide[:, : 2 * I]  # a row stride of 3I: read in place
    assert torch.equal(sk.silu_and_mul(rows), _oracle(rows))
    columns = (3 * torch.randn(2 * I, 4)).to(dtype).t()  # column stride 4: copied
    assert torch.equal(sk.silu_and_mul(columns), _oracle(columns))
    leading = (3 * torch.randn(3, 2, 2 * I)).to(dtype).transpose(0, 1)  # leading dims permuted
    assert torch.equal(sk.silu_and_mul(leading), _oracle(leading))


def _every_gate(dtype: torch.dtype) -> torch.Tensor:
    """Every 16-bit pattern of ``dtype`` but the NaNs, ``[64, 1024]``."""
    bits = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    gates = bits.view(dtype)
    gates = gates[~gates.isnan()]
    pad = torch.zeros(64 * 1024 - gates.numel(), dtype=dtype)
    return torch.cat([gates, pad]).reshape(64, 1024)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_every_half_gate_gets_torchs_silu(seed, exact_bf16, dtype):
    gate = _every_gate(dtype)
    up = (3 * torch.randn(gate.shape)).to(dtype)
    x = torch.cat([gate, up], dim=-1)
    out = sk.silu_and_mul(x)
    expected = sk.silu_and_mul_reference(x)
    assert bool(_same_bits(F.silu(gate) * up, expected).all())  # torch's expression
    # Where numpy's and torch's fp32 exp round a silu to different halves (a handful of
    # fp16 gates, no bf16 one), the kernel has numpy's; everywhere else torch's bits.
    exp_differs = ~_same_bits(_silu_with_numpy_exp(gate), F.silu(gate))
    assert int(exp_differs.sum()) <= (8 if dtype == torch.float16 else 0)
    assert bool(_same_bits(out, expected)[~exp_differs].all())


def test_non_finite_gates_follow_torch(exact_bf16):
    gate = torch.tensor([float("inf"), -float("inf"), -100.0, 100.0, 0.0, -0.0])
    x = torch.cat([gate, torch.full_like(gate, 2.0)]).half()
    out, expected = sk.silu_and_mul(x), sk.silu_and_mul_reference(x)
    assert bool(_same_bits(out, expected).all()), (out, expected)


def test_torch_backend_is_the_reference(seed, monkeypatch):
    monkeypatch.setenv("SPECTER_KERNELS_BACKEND", "torch")
    x = torch.randn(3, 2 * 16)
    assert torch.equal(sk.silu_and_mul(x), F.silu(x[:, :16]) * x[:, 16:])


def test_empty_inputs(backend):
    assert sk.silu_and_mul(torch.empty(0, 8)).shape == (0, 4)
    assert sk.silu_and_mul(torch.empty(3, 0)).shape == (3, 0)


def test_bad_inputs_are_refused():
    with pytest.raises(TypeError, match="x must be a tensor, got list"):
        sk.silu_and_mul([1.0, 2.0])
    with pytest.raises(TypeError, match=r"torch\.float64"):
        sk.silu_and_mul(torch.randn(2, 8, dtype=torch.float64))
    with pytest.raises(TypeError, match=r"torch\.int32"):
        sk.silu_and_mul(torch.ones(2, 8, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"even last dim, got shape \(2, 7\)"):
        sk.silu_and_mul(torch.randn(2, 7))
    with pytest.raises(ValueError, match=r"got shape \(\)"):
        sk.silu_and_mul(torch.tensor(1.0))
