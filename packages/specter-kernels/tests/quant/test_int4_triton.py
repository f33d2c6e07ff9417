"""``int4_triton.int4_word_dot8``, the W4A16 gemv's packed math, against float64 sums.

Under the interpreter it runs its Triton-ops form (``ASM=0``); on a CUDA device also its
inline PTX (``ASM=1``). Words are random, so every nibble value and both halves of every
f16x2 register are exercised; activations reach fp16's largest values, where fp16 products
of unscaled activations would overflow.
"""

import os

import pytest
import torch
import triton
import triton.language as tl

from kernel_helpers import rel_err
from specter_kernels.quant.int4_triton import ACTIVATION_SHIFT, int4_word_dot8

R, N = 16, 32  # word rows (128 inputs), columns
SHIFT = tl.constexpr(ACTIVATION_SHIFT)
# The Triton-ops form runs where the kernels run: the interpreter's CPU, else the GPU.
OPS_DEVICE = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
needs_ops_device = pytest.mark.skipif(
    OPS_DEVICE == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA device"
)


@triton.jit
def _word_dot8_kernel(
    words_ptr, x_ptr, zeros_ptr, out_ptr, ROWS: tl.constexpr, COLS: tl.constexpr, ASM: tl.constexpr
):
    rows = tl.arange(0, ROWS)
    cols = tl.arange(0, COLS)
    words = tl.load(words_ptr + rows[:, None] * COLS + cols[None, :])
    zeros = tl.load(zeros_ptr + cols)[None, :].to(tl.float16) + 1024.0
    r_mask = rows < ROWS
    # a scale of ACTIVATION_SHIFT (exact in fp16): the result is the shifted dot itself
    scales = tl.full([1, COLS], SHIFT, dtype=tl.float16)
    out = int4_word_dot8(words, x_ptr, rows, r_mask, scales, zeros, ASM)
    tl.store(out_ptr + rows[:, None] * COLS + cols[None, :], out)


def _problem(device: str, magnitude: float):
    words = torch.randint(-(2**31), 2**31, (R, N), dtype=torch.int64).to(torch.int32)
    zeros = torch.randint(0, 16, (N,), dtype=torch.uint8)
    x = (torch.rand(8 * R) * 2 - 1) * magnitude
    return words.to(device), x.half().to(device), zeros.to(device)


def _expected(words, x, zeros):
    """float64 ``sum_j x[8 r + j] * (q_j - zero) * ACTIVATION_SHIFT`` per word ``[R, N]``."""
    w = words.cpu().to(torch.int64) & 0xFFFFFFFF
    q = torch.stack([(w >> (4 * j)) & 0xF for j in range(8)], dim=-1).double()  # [R, N, 8]
    q = q - zeros.cpu().double()[None, :, None]
    xs = x.cpu().double().reshape(R, 1, 8) * ACTIVATION_SHIFT
    return (q * xs).sum(-1)


def _run(words, x, zeros, asm: int) -> torch.Tensor:
    out = torch.empty(R, N, dtype=torch.float32, device=words.device)
    _word_dot8_kernel[(1,)](words, x, zeros, out, ROWS=R, COLS=N, ASM=asm)
    return out


@needs_ops_device
@pytest.mark.parametrize("magnitude", [1.0, 60000.0])
def test_word_dot8_triton_ops(seed, magnitude):
    words, x, zeros = _problem(OPS_DEVICE, magnitude)
    out = _run(words, x, zeros, asm=0)
    assert torch.isfinite(out).all()
    # four fp16 products a half, each rounded, then widened: fp16's 2**-11 per term
    assert rel_err(out.double().cpu(), _expected(words, x, zeros)) < 2e-3


@needs_ops_device
def test_word_dot8_is_exact_for_small_integers(seed):
    # Activations that are small integers make every fp16 product and partial sum exact, so
    # the kernel must give the float64 sum exactly: catches a nibble paired with the wrong
    # activation or a wrong zero point, which a tolerance could hide.
    words, _, zeros = _problem(OPS_DEVICE, 1.0)
    x = torch.randint(-4, 5, (8 * R,)).half().to(OPS_DEVICE)
    out = _run(words, x, zeros, asm=0)
    assert torch.equal(out.double().cpu(), _expected(words, x, zeros))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("magnitude", [1.0, 60000.0])
def test_word_dot8_ptx_on_the_gpu(seed, monkeypatch, magnitude):
    monkeypatch.setenv("SPECTER_KERNELS_BACKEND", "auto")
    words, x, zeros = _problem("cuda", magnitude)
    out = _run(words, x, zeros, asm=1)
    assert torch.isfinite(out).all()
    assert rel_err(out.double().cpu(), _expected(words, x, zeros)) < 2e-3
    small = torch.randint(-4, 5, (8 * R,), device="cuda").half()
    exact = _run(words, small, zeros, asm=1).double().cpu()
    assert torch.equal(exact, _expected(words, small, zeros))
