"""GPTQ import against an independent, deliberately slow packing written here."""

import pytest
import torch

import specter_kernels as sk


def slow_gptq_tensors(q, zeros, scales, checkpoint_format):
    """Pack like a GPTQ checkpoint, one nibble at a time with Python ints.

    q: int [K, N] values 0..15; zeros: int [K/G, N] zero points; scales: [K/G, N].
    Returns (qweight [K/8, N], qzeros [K/G, N/8]) as int32.
    """
    K, N = q.shape
    groups = zeros.shape[0]
    qweight = [[0] * N for _ in range(K // 8)]
    for k in range(K):
        for n in range(N):
            qweight[k // 8][n] |= int(q[k, n]) << (4 * (k % 8))
    stored = zeros - 1 if checkpoint_format == "gptq" else zeros
    qzeros = [[0] * (N // 8) for _ in range(groups)]
    for g in range(groups):
        for n in range(N):
            qzeros[g][n // 8] |= (int(stored[g, n]) & 0xF) << (4 * (n % 8))

    def to_int32(rows):
        return torch.tensor(
            [[v - (1 << 32) if v >= 1 << 31 else v for v in r] for r in rows], dtype=torch.int32
        )

    return to_int32(qweight), to_int32(qzeros)


def expected_weight(q, zeros, scales, group):
    """[N, K] float weights (q - zero) * scale, rounded to fp16 like the kernels."""
    z = zeros.repeat_interleave(group, dim=0)
    s = scales.repeat_interleave(group, dim=0)
    return ((q - z).half() * s).T.float()


@pytest.mark.parametrize("checkpoint_format", ["gptq", "gptq_v2"])
@pytest.mark.parametrize("group", [32, 64])
def test_asymmetric_import_matches_the_slow_packing(seed, checkpoint_format, group):
    K, N = 128, 24
    q = torch.randint(0, 16, (K, N))
    low = 1 if checkpoint_format == "gptq" else 0  # v1 cannot store zero point 0
    zeros = torch.randint(low, 16, (K // group, N))
    scales = (torch.rand(K // group, N) + 0.1).half()
    qweight, qzeros = slow_gptq_tensors(q, zeros, scales, checkpoint_format)
    w = sk.import_gptq(qweight, qzeros, scales, sym=False, checkpoint_format=checkpoint_format)
    assert (w.num_experts, w.out_features, w.in_features, w.group_size) == (1, N, K, group)
    assert not w.symmetric
    assert torch.equal(w.zeros[0].long(), zeros)
    assert torch.equal(
        sk.dequantize_int4(w, torch.float32)[0], expected_weight(q, zeros, scales, group)
    )


@pytest.mark.parametrize("checkpoint_format", ["gptq", "gptq_v2"])
def test_symmetric_import_of_stacked_experts(seed, checkpoint_format):
    E, K, N, group = 3, 64, 16, 32
    tensors = []
    qs = []
    for _ in range(E):
        q = torch.randint(0, 16, (K, N))
        scales = (torch.rand(K // group, N) + 0.1).half()
        qweight, qzeros = slow_gptq_tensors(
            q, torch.full((K // group, N), 8), scales, checkpoint_format
        )
        tensors.append((qweight, qzeros, scales))
        qs.append((q, scales))
    stacked = [torch.stack([t[i] for t in tensors]) for i in range(3)]
    g_idx = torch.arange(K, dtype=torch.int32) // group
    w = sk.import_gptq(*stacked, g_idx, sym=True, checkpoint_format=checkpoint_format)
    assert w.symmetric
    assert w.num_experts == E
    dense = sk.dequantize_int4(w, torch.float32)
    for e, (q, scales) in enumerate(qs):
        assert torch.equal(
            dense[e], expected_weight(q, torch.full((K // group, N), 8), scales, group)
        )


def test_v1_stored_fifteen_means_zero_point_sixteen(seed):
    K, N = 32, 8
    q = torch.randint(0, 16, (K, N))
    zeros = torch.full((1, N), 16)
    scales = torch.ones(1, N).half()
    qweight, qzeros = slow_gptq_tensors(q, zeros, scales, "gptq")  # stores 15
    w = sk.import_gptq(qweight, qzeros, scales, sym=False, checkpoint_format="gptq")
    assert torch.equal(sk.dequantize_int4(w, torch.float32)[0], (q - 16).T.float())


def _small_checkpoint():
    q = torch.randint(0, 16, (64, 16))
    scales = torch.ones(2, 16).half()
    qweight, qzeros = slow_gptq_tensors(q, torch.full((2, 16), 8), scales, "gptq")
    return qweight, qzeros, scales


def test_act_order_and_unsupported_checkpoints_are_refused(seed):
    qweight, qzeros, scales = _small_checkpoint()
    with pytest.raises(ValueError, match="desc_act"):
        sk.import_gptq(qweight, qzeros, scales, desc_act=True)
    shuffled = (torch.arange(64) // 32)[torch.randperm(64)].int()
    if torch.equal(shuffled, torch.arange(64) // 32):
        shuffled = torch.flip(shuffled, [0])
    with pytest.raises(ValueError, match="act-order"):
        sk.import_gptq(qweight, qzeros, scales, shuffled)
    with pytest.raises(ValueError, match="bits=8"):
        sk.import_gptq(qweight, qzeros, scales, bits=8)
    with pytest.raises(ValueError, match="checkpoint_format"):
        sk.import_gptq(qweight, qzeros, scales, checkpoint_format="awq")
    with pytest.raises(ValueError, match="sym=True"):
        sk.import_gptq(qweight, qzeros, scales, checkpoint_format="gptq_v2")  # v1 zeros read as 7
    with pytest.raises(TypeError, match="int32"):
        sk.import_gptq(qweight.long(), qzeros, scales)
    with pytest.raises(ValueError, match="qzeros"):
        sk.import_gptq(qweight, qzeros[:, :1], scales)


def test_import_accepts_float32_scales_and_returns_fp16(seed):
    qweight, qzeros, scales = _small_checkpoint()
    w = sk.import_gptq(qweight, qzeros, scales.float())
    assert w.scales.dtype == torch.float16
    assert w.symmetric
