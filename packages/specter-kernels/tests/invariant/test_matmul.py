"""The batch-invariant matmul against torch, and bitwise invariance to the row count."""

import pytest
import torch

import specter_kernels as sk
from kernel_helpers import rel_err

TOLERANCE = {torch.float16: 2e-3, torch.float32: 1e-5}


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize(("M", "K", "N"), [(1, 1, 7), (5, 37, 50), (19, 70, 33)])
def test_mm_matches_torch(seed, backend, dtype, M, K, N):
    a, b = torch.randn(M, K).to(dtype), torch.randn(K, N).to(dtype)
    out = sk.invariant_mm(a, b)
    assert out.dtype == dtype
    assert out.shape == (M, N)
    assert rel_err(out, a.double() @ b.double()) < TOLERANCE[dtype]
    scores = sk.invariant_mm(a, b, out_dtype=torch.float32)
    assert scores.dtype == torch.float32
    assert rel_err(scores, a.double() @ b.double()) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_linear_reads_a_transposed_weight_and_adds_the_bias(seed, backend, dtype):
    x = torch.randn(2, 3, 40).to(dtype)
    weight, bias = torch.randn(24, 40).to(dtype), torch.randn(24).to(dtype)
    out = sk.invariant_linear(x, weight, bias)
    expected = x.double() @ weight.double().T + bias.double()
    assert out.shape == (2, 3, 24)
    assert out.dtype == dtype
    assert rel_err(out, expected) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_bmm_with_strided_operands(seed, backend, dtype):
    # k.transpose(-1, -2) of a [B, L, D] cache and a sliced query: no copies needed.
    q = torch.randn(3, 9, 40).to(dtype)[:, :, ::2]  # [3, 9, 20], stride 2 along K
    keys = torch.randn(3, 11, 20).to(dtype)
    out = sk.invariant_bmm(q, keys.transpose(1, 2), out_dtype=torch.float32)
    assert rel_err(out, q.double() @ keys.double().transpose(1, 2)) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_rows_are_bitwise_independent_of_the_row_count(seed, backend, dtype):
    M, K, N = 20, 48, 40
    x, weight = torch.randn(M, K).to(dtype), torch.randn(N, K).to(dtype)
    full = sk.invariant_linear(x, weight)
    for m in (1, 3, M):
        assert torch.equal(full[:m], sk.invariant_linear(x[:m], weight))
    changed = x.clone()
    changed[1:] = torch.randn(M - 1, K).to(dtype)
    assert torch.equal(sk.invariant_linear(changed, weight)[0], full[0])
    a, b = torch.randn(2, M, K).to(dtype), torch.randn(2, K, N).to(dtype)
    batched = sk.invariant_bmm(a, b)
    for m in (1, 3, M):
        assert torch.equal(batched[:, :m], sk.invariant_bmm(a[:, :m], b))
    assert torch.equal(batched[1:], sk.invariant_bmm(a[1:], b[1:]))


def test_bad_inputs_are_refused_with_the_shapes_named():
    a = torch.randn(4, 8)
    with pytest.raises(ValueError, match=r"\(4, 8\).*\(7, 5\)"):
        sk.invariant_mm(a, torch.randn(7, 5))
    with pytest.raises(TypeError, match="float16"):
        sk.invariant_mm(a, torch.randn(8, 5).half())
    with pytest.raises(TypeError, match="int64"):
        sk.invariant_mm(a.long(), torch.randn(8, 5).long())
    with pytest.raises(ValueError, match="3 dims"):
        sk.invariant_bmm(a, torch.randn(8, 5))
    with pytest.raises(ValueError, match="batch sizes differ"):
        sk.invariant_bmm(torch.randn(2, 4, 8), torch.randn(3, 8, 5))
    with pytest.raises(ValueError, match="K=8"):
        sk.invariant_linear(a, torch.randn(5, 9))


def test_config_depends_on_n_k_and_dtype_only():
    # The signature is the guarantee; here: equal inputs, equal config, fixed BLOCK_M.
    for N, K in ((1, 1), (2048, 2048), (102400, 2048), (1408, 2048)):
        config = sk.matmul_config(N, K, torch.float16)
        assert config == sk.matmul_config(N, K, torch.float16)
        assert config.block_m == 16
        assert config.block_n >= 16
        assert config.block_k >= 16
        assert config.block_k <= max(16, 1 << (K - 1).bit_length())


def test_tuned_tiles_are_looked_up_by_shape_dtype_and_gpu_model(tmp_path, monkeypatch):
    from specter_kernels.invariant import matmul_config as cfg

    table = {
        "configs": [
            {"N": 2048, "K": 1024, "dtype": "float16", "block_n": 32, "block_k": 256,
             "num_warps": 8, "num_stages": 2}
        ]
    }  # fmt: skip
    path = tmp_path / "invariant_matmul_some_gpu.json"
    path.write_text(__import__("json").dumps(table))
    monkeypatch.setattr(cfg, "TUNED_DIR", tmp_path)
    tuned = cfg.matmul_config(2048, 1024, torch.float16, "Some GPU")
    assert (tuned.block_m, tuned.block_n, tuned.block_k, tuned.num_warps) == (16, 32, 256, 8)
    assert tuned.num_stages == 2
    # Other shapes, dtypes, and no device keep the heuristic.
    assert cfg.matmul_config(2048, 1024, torch.float32, "Some GPU") == cfg.matmul_config(
        2048, 1024, torch.float32
    )
    assert cfg.matmul_config(2048, 1024, torch.float16) != tuned
    assert cfg.matmul_config(4096, 1024, torch.float16, "Some GPU") == cfg.matmul_config(
        4096, 1024, torch.float16
    )
    assert cfg.tuned_config_path("Some GPU") == path
    assert cfg.tuned_config_path("NVIDIA H200").name == "invariant_matmul_nvidia_h200.json"


def test_a_broken_tuned_file_is_reported(tmp_path, monkeypatch):
    from specter_kernels.invariant import matmul_config as cfg

    path = tmp_path / "invariant_matmul_some_gpu.json"
    path.write_text('{"configs": [{"N": 1}]}')
    monkeypatch.setattr(cfg, "TUNED_DIR", tmp_path)
    with pytest.raises(ValueError, match="not a tuned invariant-matmul file"):
        cfg.matmul_config(8, 8, torch.float16, "Some GPU")


def test_the_shipped_h200_tiles_load_and_keep_the_fixed_row_tile():
    from specter_kernels.invariant import matmul_config as cfg

    path = cfg.tuned_config_path("NVIDIA H200")
    assert path.is_file(), path
    table = cfg._tuned_table(path)
    assert (2048, 2048, "float16") in table
    assert all(tile.block_m == cfg.BLOCK_M for tile in table.values())
    assert (
        cfg.matmul_config(2048, 2048, torch.float16, "NVIDIA H200")
        == table[(2048, 2048, "float16")]
    )


@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
@pytest.mark.parametrize(("K", "split"), [(70, 3), (40, 4), (33, 2)])
def test_split_k_is_close_to_torch_and_bitwise_independent_of_the_row_count(
    seed, poisoned, dtype, K, split
):
    # (40, 4): stretches of 16 columns, the last one empty; (70, 3): a short last one.
    from specter_kernels.invariant import matmul_triton as kernel
    from specter_kernels.invariant.matmul_config import BLOCK_M, MatmulConfig

    # ``poisoned``: the split-K workspace and the outputs start as NaN.
    config = MatmulConfig(BLOCK_M, 16, 16, split_k=split)
    M, N = 19, 40
    x, weight = torch.randn(M, K).to(dtype), torch.randn(N, K).to(dtype)
    bias = torch.randn(N).to(dtype)

    def linear(rows: torch.Tensor, use_bias: bool = True) -> torch.Tensor:
        out = torch.full((1, rows.shape[0], N), float("nan"), dtype=dtype)
        return kernel.launch_invariant_bmm(
            rows[None], weight.T[None], out, bias if use_bias else None, config
        )[0]

    full = linear(x)
    expected = x.double() @ weight.double().T + bias.double()
    assert rel_err(full, expected) < TOLERANCE[dtype]
    assert rel_err(linear(x, use_bias=False), x.double() @ weight.double().T) < TOLERANCE[dtype]
    for m in (1, 5, 17):
        assert torch.equal(full[:m], linear(x[:m]))
    unsplit = kernel.launch_invariant_bmm(
        x[None], weight.T[None], torch.full((1, M, N), float("nan"), dtype=dtype), bias,
        MatmulConfig(BLOCK_M, 16, 16),
    )[0]  # fmt: skip
    assert rel_err(unsplit, full.double()) < TOLERANCE[dtype]


def test_a_split_below_one_is_refused():
    from specter_kernels.invariant.matmul_config import BLOCK_M, MatmulConfig

    with pytest.raises(ValueError, match="split_k must be at least 1, got 0"):
        MatmulConfig(BLOCK_M, 16, 16, split_k=0)


def test_tuned_tiles_may_split_k(tmp_path, monkeypatch):
    from specter_kernels.invariant import matmul_config as cfg

    table = {
        "configs": [
            {"N": 576, "K": 2048, "dtype": "float16", "block_n": 16, "block_k": 256,
             "num_warps": 4, "num_stages": 3, "split_k": 4}
        ]
    }  # fmt: skip
    path = tmp_path / "invariant_matmul_some_gpu.json"
    path.write_text(__import__("json").dumps(table))
    monkeypatch.setattr(cfg, "TUNED_DIR", tmp_path)
    assert cfg.matmul_config(576, 2048, torch.float16, "Some GPU").split_k == 4
    assert cfg.matmul_config(576, 2048, torch.float16).split_k == 1


def test_split_launches_leave_every_arrival_counter_at_zero(seed, poisoned):
    # The last arrival of a tile zeroes its counter, so one buffer serves every launch: a
    # counter left at k would make the next launch's tile finish after k fewer arrivals.
    from specter_kernels.invariant import matmul_triton as kernel
    from specter_kernels.invariant.matmul_config import BLOCK_M, MatmulConfig

    config = MatmulConfig(BLOCK_M, 16, 16, split_k=3)
    B, M, K, N = 2, 21, 48, 40  # two row tiles, three column tiles, two batch entries
    a, b = torch.randn(B, M, K), torch.randn(B, K, N)
    counters = kernel.tile_counters(torch.device("cpu"), 1)
    first = kernel.launch_invariant_bmm(a, b, torch.full((B, M, N), float("nan")), None, config)
    assert int(counters.count_nonzero()) == 0
    second = kernel.launch_invariant_bmm(a, b, torch.full((B, M, N), float("nan")), None, config)
    assert torch.equal(first, second)
    assert rel_err(first, a.double() @ b.double()) < 1e-5


def test_the_counter_buffer_grows_outside_a_capture_and_keeps_its_floor():
    from specter_kernels.invariant import matmul_triton as kernel

    device = torch.device("cpu")
    small = kernel.tile_counters(device, 3)
    assert small.numel() >= kernel.COUNTER_FLOOR
    assert kernel.tile_counters(device, 5) is small  # reused while large enough
    grown = kernel.tile_counters(device, kernel.COUNTER_FLOOR + 1)
    assert grown.numel() >= kernel.COUNTER_FLOOR + 1
    assert int(grown.count_nonzero()) == 0
    assert kernel.tile_counters(device, 1) is grown


def test_a_counters_in_block_uses_its_own_buffer(seed, poisoned):
    # Launches that run beside others (the shared experts' side stream) count arrivals in a
    # buffer of their own, left zeroed; the device's buffer is untouched.
    from specter_kernels.invariant import matmul_triton as kernel
    from specter_kernels.invariant.matmul_config import BLOCK_M, MatmulConfig

    device = torch.device("cpu")
    config = MatmulConfig(BLOCK_M, 16, 16, split_k=3)
    a, b = torch.randn(1, 5, 48), torch.randn(1, 48, 40)
    shared = kernel.tile_counters(device, 1)
    own = kernel.split_counters(device)
    assert own.numel() >= kernel.COUNTER_FLOOR
    assert int(own.count_nonzero()) == 0
    expected = kernel.launch_invariant_bmm(a, b, torch.empty(1, 5, 40), None, config)
    with kernel.counters_in(own):
        assert kernel.tile_counters(device, 1) is own
        with pytest.raises(RuntimeError, match="make it with split_counters"):
            kernel.tile_counters(device, own.numel() + 1)  # never grows
        got = kernel.launch_invariant_bmm(a, b, torch.empty(1, 5, 40), None, config)
    assert kernel.tile_counters(device, 1) is shared  # the block is over
    assert torch.equal(got, expected)
    assert int(own.count_nonzero()) == 0
    assert int(shared.count_nonzero()) == 0


@pytest.mark.parametrize(
    ("N", "K", "dtype"),
    [(2048, 2048, torch.float16), (64, 2048, torch.float32), (24, 64, torch.float16)],
)
def test_tuning_candidates_keep_the_row_tile_and_start_with_the_heuristic(N, K, dtype):
    from specter_kernels.invariant import matmul_config as cfg

    found = cfg.matmul_candidates(N, K, dtype, "NVIDIA H200")
    assert found[0] == cfg.matmul_config(N, K, dtype)
    assert cfg.matmul_config(N, K, dtype, "NVIDIA H200") in found
    assert len(found) == len(set(found)) > 1
    for config in found:
        assert config.block_m == cfg.BLOCK_M
        assert config.block_k <= max(2 * K, 128)
        assert config.split_k == 1 or K // config.split_k >= config.block_k
