"""The batch-invariant GEMV: against float64, bitwise invariance to the row count, its
config (eligibility, heuristic, tuned files) and invariant_bmm's dispatch to it."""

import json

import pytest
import torch

import specter_kernels as sk
import specter_kernels.invariant.gemv_config as gc
from kernel_helpers import rel_err
from specter_kernels.invariant.gemv_config import InvariantGemvConfig, gemv_config, gemv_eligible
from specter_kernels.invariant.gemv_triton import launch_invariant_gemv

TOLERANCE = {torch.float16: 2e-3, torch.float32: 1e-5}


def _gemv(x, weight, bias, config):
    out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype)
    return launch_invariant_gemv(x, weight, out, bias, config)


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize(
    ("M", "N", "K", "config"),
    [
        (1, 24, 40, InvariantGemvConfig(4, 2, 1)),  # K not a power of two: masked lanes
        (5, 37, 64, InvariantGemvConfig(8, 4, 2)),  # N not a multiple of the tile, 3 passes
        (3, 16, 96, InvariantGemvConfig(1, 1, 4)),  # one column a program, a part-empty pass
    ],
)
def test_gemv_matches_float64(seed, triton_backend, dtype, M, N, K, config):
    x, weight = torch.randn(M, K).to(dtype), torch.randn(N, K).to(dtype)
    bias = torch.randn(N).to(dtype)
    out = _gemv(x, weight, bias, config)
    assert rel_err(out, x.double() @ weight.double().T + bias.double()) < TOLERANCE[dtype]
    plain = _gemv(x, weight, None, config)
    assert rel_err(plain, x.double() @ weight.double().T) < TOLERANCE[dtype]


@pytest.mark.parametrize("rows", [1, 3])
def test_each_row_is_bitwise_independent_of_the_row_count(seed, triton_backend, rows):
    M, N, K = 7, 20, 48
    x, weight = torch.randn(M, K).half(), torch.randn(N, K).half()
    config = InvariantGemvConfig(4, 2, rows)
    full = _gemv(x, weight, None, config)
    for m in range(1, M):
        assert torch.equal(full[:m], _gemv(x[:m], weight, None, config))
    changed = x.clone()
    changed[1:] = torch.randn(M - 1, K).half()
    assert torch.equal(_gemv(changed, weight, None, config)[0], full[0])


def test_unaligned_rows_are_copied_not_misread(seed, triton_backend):
    # Rows 12 elements apart (24 bytes, not a multiple of 16) and a view at an odd offset.
    buffer = torch.randn(5 * 12 + 1).half()
    x = buffer[1:].view(5, 12)[:, :8]
    weight = torch.randn(16, 8).half()
    config = InvariantGemvConfig(2, 1, 2)
    out = _gemv(x, weight, None, config)
    assert torch.equal(out, _gemv(x.contiguous().clone(), weight, None, config))
    assert rel_err(out, x.double() @ weight.double().T) < TOLERANCE[torch.float16]


def test_eligibility_and_the_heuristic_depend_on_n_k_and_dtype_only():
    assert gemv_eligible(2048, torch.float16)
    assert not gemv_eligible(37, torch.float16)  # rows not 16-byte aligned
    assert not gemv_eligible(1, torch.float32)
    assert gemv_eligible(16384, torch.float16)  # 32 KB rows
    assert not gemv_eligible(16392, torch.float16)
    assert not gemv_eligible(16384, torch.float32)
    assert not gemv_eligible(64, torch.float64)
    config = gemv_config(2048, 2048, torch.float16)
    assert config == gemv_config(2048, 2048, torch.float16)
    assert config.block_n * 2048 // (32 * config.num_warps) == gc.TARGET_ELEMENTS_PER_THREAD
    assert gemv_config(3, 2048, torch.float16).block_n <= 4  # never wider than N
    assert gemv_config(2048, 16384, torch.float16).num_warps == 8
    assert gemv_config(2048, 37, torch.float16) is None


def test_bad_tiles_are_refused():
    with pytest.raises(ValueError, match="power of two"):
        InvariantGemvConfig(3)
    with pytest.raises(ValueError, match="num_warps"):
        InvariantGemvConfig(4, 3)
    with pytest.raises(ValueError, match="rows must be 1 to 16"):
        InvariantGemvConfig(4, 4, 0)


def test_tuned_tiles_are_looked_up_by_shape_dtype_and_gpu_model(tmp_path, monkeypatch):
    path = tmp_path / "invariant_gemv_any_gpu.json"
    entry = {"N": 96, "K": 64, "dtype": "float16", "block_n": 2, "num_warps": 8, "rows": 3}
    path.write_text(json.dumps({"configs": [entry]}))
    monkeypatch.setattr(gc, "TUNED_DIR", tmp_path)
    assert gemv_config(96, 64, torch.float16, "Any GPU") == InvariantGemvConfig(2, 8, 3)
    heuristic = gc.heuristic_gemv_config(96, 64, torch.float16)
    assert gemv_config(96, 64, torch.float32, "Any GPU") == gc.heuristic_gemv_config(
        96, 64, torch.float32
    )
    assert gemv_config(96, 64, torch.float16) == heuristic  # no GPU named: no tuned file
    assert gc.tuned_gemv_path("Any GPU") == path
    assert gc.tuned_gemv_path("NVIDIA H200").name == "invariant_gemv_nvidia_h200.json"


def test_a_shape_the_tuned_file_gives_to_the_mma_kernel_gets_no_gemv(tmp_path, monkeypatch):
    path = tmp_path / "invariant_gemv_any_gpu.json"
    path.write_text(
        json.dumps({"configs": [{"N": 96, "K": 64, "dtype": "float16", "kernel": "mma"}]})
    )
    monkeypatch.setattr(gc, "TUNED_DIR", tmp_path)
    assert gemv_config(96, 64, torch.float16, "Any GPU") is None
    assert gemv_config(96, 64, torch.float16) is not None  # the heuristic, off a GPU


@pytest.mark.parametrize(
    "entry", [{"N": 1}, {"N": 1, "K": 64, "dtype": "float16", "kernel": "cublas"}]
)
def test_a_broken_tuned_file_is_reported(tmp_path, monkeypatch, entry):
    path = tmp_path / "invariant_gemv_any_gpu.json"
    path.write_text(json.dumps({"configs": [entry]}))
    monkeypatch.setattr(gc, "TUNED_DIR", tmp_path)
    with pytest.raises(ValueError, match="not a tuned invariant-GEMV file"):
        gemv_config(1, 64, torch.float16, "Any GPU")


def test_the_shipped_tuned_files_parse_into_valid_tiles():
    for path in sorted(gc.TUNED_DIR.glob("invariant_gemv_*.json")):
        table = gc._tuned_table(path)
        assert table, path
        for (N, K, dtype), config in table.items():
            if config is not None:
                assert gemv_eligible(K, getattr(torch, dtype)), (path, N, K)
                assert isinstance(config, InvariantGemvConfig)
        assert any(config is not None for config in table.values())


def test_invariant_linear_takes_the_gemv_where_it_applies(seed, triton_backend, monkeypatch):
    calls = []
    import specter_kernels.invariant.gemv_triton as gt

    real = gt.launch_invariant_gemv
    monkeypatch.setattr(
        gt, "launch_invariant_gemv", lambda *a, **k: calls.append((a, k)) or real(*a, **k)
    )
    x, weight, bias = torch.randn(3, 48).half(), torch.randn(20, 48).half(), torch.randn(20).half()
    out = sk.invariant_linear(x, weight, bias)
    assert len(calls) == 1
    assert calls[0][1] == {"preload": False}  # only a caller's promise makes it preload
    # A constant weight may be loaded before the PDL wait: the same bits.
    assert torch.equal(sk.invariant_linear(x, weight, bias, constant_weight=True), out)
    assert calls[1][1] == {"preload": True}
    calls.pop()
    assert rel_err(out, x.double() @ weight.double().T + bias.double()) < 2e-3
    sk.invariant_linear(torch.randn(3, 37).half(), torch.randn(20, 37).half())  # K % 8 != 0
    sk.invariant_linear(x, torch.randn(48, 20).half().T)  # a weight strided along K
    # Matmuls of runtime operands keep the MMA kernel, even when shaped like a linear
    # (attention's scores: N is the key count, which differs between plain and verify).
    sk.invariant_bmm(x[None], weight.T[None])
    sk.invariant_mm(x, weight.T)
    assert len(calls) == 1


def test_a_bias_of_the_wrong_length_is_refused_before_the_gemv(triton_backend):
    x, weight = torch.randn(2, 48).half(), torch.randn(20, 48).half()
    with pytest.raises(ValueError, match=r"bias must be \[N=20\]"):
        sk.invariant_linear(x, weight, torch.randn(19).half())


@pytest.mark.parametrize(
    ("N", "K", "dtype"),
    [(2048, 2048, torch.float16), (64, 2048, torch.float32), (24, 64, torch.float16)],
)
def test_tuning_candidates_are_valid_distinct_and_start_with_the_heuristic(N, K, dtype):
    found = gc.gemv_candidates(N, K, dtype)
    assert found[0] == gc.heuristic_gemv_config(N, K, dtype)
    assert len(found) == len(set(found)) > 1
    for config in found[1:]:
        per_thread = config.block_n * 2 ** (K - 1).bit_length() / (32 * config.num_warps)
        assert 8 <= per_thread <= 256 // dtype.itemsize
        assert config.block_n <= 2 ** (N - 1).bit_length()
    shipped = gemv_config(3072, 2048, torch.float16, "NVIDIA H200")
    assert shipped in gc.gemv_candidates(3072, 2048, torch.float16, "NVIDIA H200")
