"""Interleaved rotary embedding: transformers' DeepSeek-V2 arithmetic in one launch."""

import pytest
import torch
from transformers.models.deepseek_v2.modeling_deepseek_v2 import apply_rotary_emb

import specter_kernels as sk
from kernel_helpers import rel_err


def _freqs(batch: int, seq: int, half: int, offset: int = 0) -> torch.Tensor:
    """``[batch, seq, half]`` complex64 as DeepSeek-V2's rotary module makes them."""
    inv = 1.0 / (10000 ** (torch.arange(0, 2 * half, 2, dtype=torch.float) / (2 * half)))
    pos = torch.arange(offset, offset + seq, dtype=torch.float)
    angles = pos[:, None] * inv[None, :]
    freqs = torch.polar(torch.ones_like(angles), angles)
    return freqs.unsqueeze(0).expand(batch, -1, -1).contiguous()


def test_reference_is_transformers_apply_rotary_emb(seed):
    q = torch.randn(2, 3, 5, 8).half()
    k = torch.randn(2, 1, 5, 8).half()
    freqs = _freqs(2, 5, 4, offset=7)
    expected_q, expected_k = apply_rotary_emb(q, k, freqs)
    assert torch.equal(sk.rotary_complex_reference(q, freqs), expected_q)
    assert torch.equal(sk.rotary_complex_reference(k, freqs), expected_k)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize(("B", "H", "S", "D"), [(1, 1, 1, 2), (1, 4, 3, 64), (2, 3, 5, 10)])
def test_matches_the_reference(seed, backend, dtype, B, H, S, D):
    x = (2 * torch.randn(B, H, S, D)).to(dtype)
    freqs = _freqs(B, S, D // 2, offset=11)
    out = sk.rotary_complex(x, freqs)
    expected = sk.rotary_complex_reference(x.double().float(), freqs).double()
    assert out.shape == x.shape
    assert out.dtype == dtype
    assert out.is_contiguous()
    assert rel_err(out, expected) < (1e-3 if dtype == torch.float16 else 1e-6)


def test_strided_rope_slice_and_broadcast_positions(seed, backend):
    # The rope part of a query: the last 8 of 24 features, heads transposed in.
    q = torch.randn(2, 6, 3, 24).half().transpose(1, 2)  # [B, H=3, S=6, 24], not contiguous
    q_pe = q[..., 16:]
    freqs = _freqs(1, 6, 4, offset=2)  # one batch row of positions, broadcast over B
    out = sk.rotary_complex(q_pe, freqs)
    expected = sk.rotary_complex_reference(q_pe, freqs)
    assert rel_err(out, expected) < 1e-3


def test_rows_are_batch_invariant(seed, triton_backend):
    x = torch.randn(1, 2, 7, 16).half()
    freqs = _freqs(1, 7, 8)
    together = sk.rotary_complex(x, freqs)
    alone = torch.cat(
        [sk.rotary_complex(x[:, :, i : i + 1], freqs[:, i : i + 1]) for i in range(7)], dim=2
    )
    assert torch.equal(together, alone)


def test_bad_inputs_are_refused():
    x = torch.randn(1, 2, 3, 8)
    freqs = _freqs(1, 3, 4)
    with pytest.raises(TypeError, match="float64"):
        sk.rotary_complex(x.double(), freqs)
    with pytest.raises(TypeError, match="complex64"):
        sk.rotary_complex(x, torch.view_as_real(freqs))
    with pytest.raises(ValueError, match="D even"):
        sk.rotary_complex(torch.randn(1, 2, 3, 7), freqs)
    with pytest.raises(ValueError, match=r"\[B or 1, S, D/2\]"):
        sk.rotary_complex(x, _freqs(1, 4, 4))
    with pytest.raises(ValueError, match=r"\[B or 1, S, D/2\]"):
        sk.rotary_complex(x, _freqs(3, 3, 4))


def _cos_sin(batch: int, seq: int, dim: int, dtype: torch.dtype, offset: int = 0):
    """``[batch, seq, dim]`` cos and sin as Qwen2-MoE's rotary module makes them."""
    inv = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
    pos = torch.arange(offset, offset + seq, dtype=torch.float)
    angles = pos[:, None] * inv[None, :]
    emb = torch.cat((angles, angles), dim=-1)
    cos = emb.cos().to(dtype).unsqueeze(0).expand(batch, -1, -1).contiguous()
    sin = emb.sin().to(dtype).unsqueeze(0).expand(batch, -1, -1).contiguous()
    return cos, sin


def test_half_reference_is_transformers_apply_rotary_pos_emb(seed):
    from transformers.models.qwen2_moe.modeling_qwen2_moe import apply_rotary_pos_emb

    q = torch.randn(2, 4, 5, 16).half()
    k = torch.randn(2, 2, 5, 16).half()
    cos, sin = _cos_sin(2, 5, 16, torch.float16, offset=3)
    expected_q, expected_k = apply_rotary_pos_emb(q, k, cos, sin)
    assert torch.equal(sk.rotary_half_reference(q, cos, sin), expected_q)
    assert torch.equal(sk.rotary_half_reference(k, cos, sin), expected_k)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize(("B", "H", "S", "D"), [(1, 1, 1, 2), (1, 4, 3, 64), (2, 3, 5, 10)])
def test_half_equals_the_reference_bit_for_bit(seed, backend, dtype, B, H, S, D):
    x = (2 * torch.randn(B, H, S, D)).to(dtype)
    cos, sin = _cos_sin(B, S, D, dtype, offset=9)
    out = sk.rotary_half(x, cos, sin)
    expected = sk.rotary_half_reference(x, cos, sin)
    assert out.dtype == expected.dtype == dtype
    assert out.is_contiguous()
    assert torch.equal(out, expected)


def test_half_strided_query_broadcast_positions_and_promotion(seed, backend):
    q = torch.randn(2, 6, 3, 16).half().transpose(1, 2)  # [B, H=3, S=6, D], not contiguous
    cos, sin = _cos_sin(1, 6, 16, torch.float16)
    assert torch.equal(sk.rotary_half(q, cos, sin), sk.rotary_half_reference(q, cos, sin))
    cos32, sin32 = _cos_sin(1, 6, 16, torch.float32)  # fp32 tables: an fp32 result, as torch
    out = sk.rotary_half(q, cos32, sin32)
    assert out.dtype == torch.float32
    assert torch.equal(out, sk.rotary_half_reference(q, cos32, sin32))


def test_half_bad_inputs_are_refused():
    x = torch.randn(1, 2, 3, 8)
    cos, sin = _cos_sin(1, 3, 8, torch.float32)
    with pytest.raises(TypeError, match="float64"):
        sk.rotary_half(x.double(), cos, sin)
    with pytest.raises(TypeError, match="share a dtype"):
        sk.rotary_half(x, cos, sin.half())
    with pytest.raises(ValueError, match="D even"):
        sk.rotary_half(torch.randn(1, 2, 3, 7), cos, sin)
    with pytest.raises(ValueError, match=r"cos must be \[B or 1, S, D\]"):
        sk.rotary_half(x, cos[:, :2], sin)


_HALF_PTX = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from specter_kernels.attention import rotary_triton as rt

signature = {name: "i32" for name in ("H", "S", "HALF", "sxb", "sxh", "sxs", "sxd", "scb",
                                      "scs", "ssb", "sss")}
signature = {"x_ptr": "*fp16", "cos_ptr": "*fp16", "sin_ptr": "*fp16", "out_ptr": "*fp16",
             **signature, "BLOCK": "constexpr", "PDL": "constexpr"}
options = dict(rt.HALF_COMPILE_OPTIONS)
src = ASTSource(fn=rt._rotary_half_kernel, signature=signature, constexprs={"BLOCK": 64, "PDL": 1})
kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
sys.stdout.write(json.dumps(kernel.asm["ptx"]))
"""


def test_half_kernel_keeps_torch_roundings_in_ptx():
    """The fp16 products and sum must stay separately rounded on the GPU (as torch does):
    compile the launch's kernel for an H100/H200 (sm_90) and read its PTX. Without
    ``enable_fp_fusion=False`` LLVM emits ``fma.rn.f16`` here. Needs no GPU: a subprocess
    without the interpreter compiles it."""
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, "-c", _HALF_PTX], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    ptx = json.loads(done.stdout)
    assert "mul.rn.f16" in ptx  # torch's rounded products ...
    assert "add.rn.f16" in ptx  # ... and rounded sum
    assert "fma" not in ptx
    assert "griddepcontrol.wait" in ptx  # compiled in PDL's wait mode, as on an H200
