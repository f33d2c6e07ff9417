"""Fused RMSNorm: transformers' arithmetic in one launch, batch-invariant rows, clear errors."""

import pytest
import torch
from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2RMSNorm

import specter_kernels as sk
from kernel_helpers import rel_err


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_reference_is_transformers_rms_norm(seed, dtype):
    N = 48
    module = DeepseekV2RMSNorm(N, eps=1e-6).to(dtype)
    with torch.no_grad():
        module.weight.copy_(1 + 0.3 * torch.randn(N))
    x = (2 * torch.randn(5, N)).to(dtype)
    expected = module(x)
    out = sk.rms_norm_reference(x, module.weight.detach(), 1e-6)
    assert out.dtype == expected.dtype == dtype
    assert torch.equal(out, expected)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize("N", [1, 48, 1100, 5000])
def test_matches_the_reference(seed, backend, dtype, N):
    weight = (1 + 0.3 * torch.randn(N)).to(dtype)
    x = (3 * torch.randn(2, 3, N)).to(dtype)
    out = sk.rms_norm(x, weight, 1e-5)
    expected = sk.rms_norm_reference(x.double(), weight.double(), 1e-5)
    assert out.shape == x.shape
    assert out.dtype == dtype
    assert rel_err(out, expected) < (2e-3 if dtype == torch.float16 else 1e-6)


def test_rows_are_batch_invariant(seed, triton_backend):
    N = 300
    weight = (1 + 0.3 * torch.randn(N)).half()
    x = (4 * torch.randn(7, N)).half()
    together = sk.rms_norm(x, weight, 1e-6)
    alone = torch.cat([sk.rms_norm(x[i : i + 1], weight, 1e-6) for i in range(7)])
    assert torch.equal(together, alone)


def test_strided_input_and_promoted_weight(seed, backend):
    N = 64
    base = torch.randn(N, 6).half()
    x = base.t()  # [6, N], stride 1 along rows: copied to a unit stride along N
    weight = 1 + 0.3 * torch.randn(N)  # fp32 weight, fp16 input: an fp32 result, as torch
    out = sk.rms_norm(x, weight, 1e-6)
    expected = sk.rms_norm_reference(x, weight, 1e-6)
    assert out.dtype == torch.float32
    assert rel_err(out, expected) < 1e-3


def test_bad_inputs_are_refused():
    x = torch.randn(2, 8)
    with pytest.raises(TypeError, match="float64"):
        sk.rms_norm(x.double(), torch.ones(8), 1e-6)
    with pytest.raises(ValueError, match=r"weight \[N\]"):
        sk.rms_norm(x, torch.ones(9), 1e-6)
    with pytest.raises(ValueError, match="eps must be >= 0"):
        sk.rms_norm(x, torch.ones(8), -1.0)
