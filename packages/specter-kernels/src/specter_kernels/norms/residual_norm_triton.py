"""Triton kernels of the fused residual adds (see ``residual_norm``): one program per row.

``_add_rms_norm_kernel`` is ``rms_norm_triton``'s kernel with the row replaced by the
rounded sum ``residual + x``: the same block, warps, fp32 lanes and reduction tree, so
its normed row has the bits ``rms_norm`` gives for that sum.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from specter_kernels.norms.rms_norm_triton import MAX_BLOCK, NUM_WARPS
from specter_kernels.pdl import pdl_enter, pdl_options

ADD_BLOCK = 1024
"""Elements per loop step of ``_residual_add_kernel``."""


@triton.jit(do_not_specialize=["stride_xr", "stride_rr", "stride_sr", "stride_or"])
def _add_rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, sum_ptr, out_ptr, N,
    stride_xr, stride_rr, stride_sr, stride_or, eps,
    BLOCK: tl.constexpr, PDL: tl.constexpr = 0,
):  # fmt: skip
    pdl_enter(PDL)  # first: with PDL, wait for the previous kernel
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    x_row = x_ptr + row * stride_xr
    r_row = res_ptr + row * stride_rr
    s_row = sum_ptr + row * stride_sr
    out_row = out_ptr + row * stride_or
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for n0 in range(0, N, BLOCK):
        nn = n0 + offs
        keep = nn < N
        x = tl.load(x_row + nn, mask=keep, other=0.0).to(tl.float32)
        r = tl.load(r_row + nn, mask=keep, other=0.0).to(tl.float32)
        s = (r + x).to(sum_ptr.dtype.element_ty)  # rounded, as torch's add rounds it
        tl.store(s_row + nn, s, mask=keep)
        s = s.to(tl.float32)
        acc += s * s
    inv = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / N + eps)
    for n0 in range(0, N, BLOCK):
        nn = n0 + offs
        keep = nn < N
        x = tl.load(x_row + nn, mask=keep, other=0.0).to(tl.float32)
        r = tl.load(r_row + nn, mask=keep, other=0.0).to(tl.float32)
        s = (r + x).to(sum_ptr.dtype.element_ty).to(tl.float32)  # the sum again, not reread
        normed = (s * inv).to(sum_ptr.dtype.element_ty)  # back to the input's dtype, as torch
        w = tl.load(w_ptr + nn, mask=keep, other=0.0).to(tl.float32)
        y = w * normed.to(tl.float32)
        tl.store(out_row + nn, y.to(out_ptr.dtype.element_ty), mask=keep)


@triton.jit(do_not_specialize=["stride_rr", "stride_ar", "stride_br", "stride_or"])
def _residual_add_kernel(
    res_ptr, a_ptr, b_ptr, out_ptr, N,
    stride_rr, stride_ar, stride_br, stride_or,
    BLOCK: tl.constexpr, PDL: tl.constexpr = 0,
):  # fmt: skip
    pdl_enter(PDL)  # first: with PDL, wait for the previous kernel
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    keep = offs < N
    r = tl.load(res_ptr + row * stride_rr + offs, mask=keep, other=0.0).to(tl.float32)
    a = tl.load(a_ptr + row * stride_ar + offs, mask=keep, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + row * stride_br + offs, mask=keep, other=0.0).to(tl.float32)
    inner = (a + b).to(out_ptr.dtype.element_ty).to(tl.float32)  # rounded, as torch's add
    tl.store(out_ptr + row * stride_or + offs, (r + inner).to(out_ptr.dtype.element_ty), mask=keep)


def launch_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
    out_dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``(summed [R, N], normed [R, N])`` of rows ``x``, ``residual`` ``[R, N]`` (unit
    stride along N, one dtype) and ``weight [N]``."""
    R, N = x.shape
    summed = torch.empty(R, N, dtype=x.dtype, device=x.device)
    normed = torch.empty(R, N, dtype=out_dtype, device=x.device)
    block = min(triton.next_power_of_2(N), MAX_BLOCK)
    _add_rms_norm_kernel[(R,)](
        x, residual, weight, summed, normed, N,
        x.stride(0), residual.stride(0), summed.stride(0), normed.stride(0), eps,
        BLOCK=block, num_warps=NUM_WARPS,
        **pdl_options(x.device, early_trigger=True),
    )  # fmt: skip
    return summed, normed


def launch_residual_add(residual: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``residual + (a + b)`` of ``[R, N]`` rows (unit stride along N, one dtype)."""
    R, N = residual.shape
    out = torch.empty(R, N, dtype=residual.dtype, device=residual.device)
    block = min(triton.next_power_of_2(N), ADD_BLOCK)
    _residual_add_kernel[(R, triton.cdiv(N, block))](
        residual, a, b, out, N,
        residual.stride(0), a.stride(0), b.stride(0), out.stride(0),
        BLOCK=block, num_warps=4,
        **pdl_options(residual.device, early_trigger=True),
    )  # fmt: skip
    return out
