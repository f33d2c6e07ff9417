"""Triton kernel of ``silu_and_mul``: one program per (row, block of ``BLOCK`` columns).

torch's CUDA kernels compute ``silu(g) = g / (1 + expf(-g))`` in fp32 with CUDA's accurate
``expf`` and IEEE division, round it to the input's dtype, then multiply in fp32 and round
again. The kernel makes the same calls: libdevice's ``exp`` (the library nvcc's ``expf``
comes from; ``tl.exp`` is the faster ``ex2.approx`` and differs in the last bits),
``div_rn`` (Triton's ``/`` on fp32 is the approximate ``div.full.f32``), and no fp
contraction, so its bits equal torch's. The interpreter has no libdevice: there the kernel
takes ``tl.exp`` (numpy's ``exp``), which the CPU tests account for.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from specter_kernels.backend import triton_interpreter_enabled
from specter_kernels.pdl import pdl_enter, pdl_options

MAX_BLOCK = 1024
# No contraction: one fused multiply-add where torch rounds twice would change the bits.
COMPILE_OPTIONS = {"num_warps": 4, "enable_fp_fusion": False}


@triton.jit(do_not_specialize=["stride_xr"])
def _silu_and_mul_kernel(
    x_ptr,
    out_ptr,
    I,
    stride_xr,
    BLOCK: tl.constexpr,
    LIBDEVICE_EXP: tl.constexpr,
    PDL: tl.constexpr = 0,
):
    pdl_enter(PDL)  # first: with PDL, wait for the previous kernel
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    keep = cols < I
    x_row = x_ptr + row * stride_xr
    gate = tl.load(x_row + cols, mask=keep, other=0.0).to(tl.float32)
    up = tl.load(x_row + I + cols, mask=keep, other=0.0).to(tl.float32)
    if LIBDEVICE_EXP:
        decay = libdevice.exp(-gate)
    else:
        decay = tl.exp(-gate)
    silu = tl.math.div_rn(gate, 1.0 + decay)
    dtype = out_ptr.dtype.element_ty
    silu = silu.to(dtype).to(tl.float32)  # F.silu's result, rounded to the dtype as torch's
    tl.store(out_ptr + row * I + cols, (silu * up).to(dtype), mask=keep)


def launch_silu_and_mul(rows: torch.Tensor) -> torch.Tensor:
    """``[R, I]`` ``silu(rows[:, :I]) * rows[:, I:]`` of ``rows [R, 2I]`` (unit column stride)."""
    R, two_i = rows.shape
    I = two_i // 2
    out = torch.empty(R, I, dtype=rows.dtype, device=rows.device)
    block = min(triton.next_power_of_2(I), MAX_BLOCK)
    grid = (R, triton.cdiv(I, block))
    _silu_and_mul_kernel[grid](
        rows, out, I, rows.stride(0), BLOCK=block,
        LIBDEVICE_EXP=not triton_interpreter_enabled(), **COMPILE_OPTIONS,
        **pdl_options(rows.device, early_trigger=True),
    )  # fmt: skip
    return out
