"""cpu_moe: --n-cpu-moe auto keeps the fewest blocks' experts on the CPU that fit the budget."""

import pytest

from gguf_samples import F16, Q8_0, deepseek_v2_lite_gguf
from specter_bench.llama_cpp.cpu_moe import (
    COMPUTE_ACTIVATION_WIDTH,
    FIXED_RESERVE_BYTES,
    GB,
    BudgetTooSmallError,
    estimate_at,
    gpu_footprint,
    plan_cpu_moe,
)
from specter_bench.llama_cpp.gguf_file import read_gguf

BLOCK_EXPERTS = 3 * 2048 * 1408 * 64 * 2  # one block's routed experts in FP16


@pytest.fixture(scope="module")
def dsv2(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    return {
        "f16": read_gguf(deepseek_v2_lite_gguf(root / "f16.gguf", F16)),
        "q8_0": read_gguf(deepseek_v2_lite_gguf(root / "q8.gguf", Q8_0)),
    }


def test_footprint_splits_experts_per_block_and_keeps_embeddings_on_the_host(dsv2):
    footprint = gpu_footprint(dsv2["f16"], n_ctx=1024)
    assert footprint.expert_bytes_per_block[0] == 0  # the dense first block
    assert set(footprint.expert_bytes_per_block[1:]) == {BLOCK_EXPERTS}
    assert footprint.host_bytes == 2048 * 102400 * 2
    every = dsv2["f16"].total_bytes
    assert footprint.non_expert_bytes == every - footprint.host_bytes - 26 * BLOCK_EXPERTS
    # MLA cache: (576 + 512) values a block and position, one head, FP16.
    assert footprint.kv_bytes == 1024 * 27 * (576 + 512) * 2
    assert footprint.compute_bytes == 512 * 4 * (102400 + COMPUTE_ACTIVATION_WIDTH * 2048)


@pytest.mark.parametrize("budget", [24.0, 16.0, 10.0])
def test_auto_picks_the_fewest_cpu_blocks_that_fit(dsv2, budget):
    footprint = gpu_footprint(dsv2["f16"], n_ctx=1024)
    plan = plan_cpu_moe(footprint, budget)
    n = plan.n_cpu_moe
    assert plan.estimated_gpu_gb <= budget
    assert estimate_at(footprint, n - 1, budget).estimated_gpu_gb > budget  # minimal
    assert plan.moe_blocks_on_cpu == n - 1  # block 0 has no experts to move
    assert plan.cpu_expert_gb == pytest.approx((n - 1) * BLOCK_EXPERTS / GB)
    total = sum(plan.breakdown.values())
    assert total == pytest.approx(plan.estimated_gpu_gb)
    assert plan.breakdown["reserve"] == pytest.approx(FIXED_RESERVE_BYTES / GB)


def test_tighter_budgets_and_drafts_move_more_blocks(dsv2):
    target = gpu_footprint(dsv2["f16"], n_ctx=1024)
    at = {b: plan_cpu_moe(target, b).n_cpu_moe for b in (40.0, 24.0, 16.0)}
    assert at[40.0] < at[24.0] < at[16.0]
    draft = gpu_footprint(dsv2["q8_0"], n_ctx=1024)
    with_draft = plan_cpu_moe(target, 40.0, draft=draft)
    assert with_draft.n_cpu_moe > at[40.0]
    assert with_draft.breakdown["draft"] == pytest.approx(draft.gpu_bytes(0) / GB)


def test_no_budget_keeps_every_expert_on_the_gpu(dsv2):
    plan = plan_cpu_moe(gpu_footprint(dsv2["f16"], n_ctx=640), None)
    assert plan.n_cpu_moe == 0
    assert plan.cpu_expert_gb == 0
    assert "no budget" in plan.describe()
    assert plan.estimated_gpu_gb > 31.0 - 0.42  # everything but the token embeddings


def test_a_budget_below_the_non_expert_state_says_what_it_needs(dsv2):
    footprint = gpu_footprint(dsv2["f16"], n_ctx=1024)
    floor = estimate_at(footprint, 27, 1.0).estimated_gpu_gb
    with pytest.raises(BudgetTooSmallError, match=rf"give at least {floor:.1f} GB"):
        plan_cpu_moe(footprint, 1.0)
    with pytest.raises(ValueError, match="the model has 27 blocks"):
        estimate_at(footprint, 28, None)


def test_a_dense_model_is_refused(tmp_path):
    from gguf_samples import write_gguf

    dense = write_gguf(
        tmp_path / "dense.gguf",
        {"general.architecture": "llama", "llama.block_count": 1},
        [("blk.0.ffn_up.weight", (64, 128), F16)],
    )
    with pytest.raises(ValueError, match="Mixture-of-Experts models only"):
        gpu_footprint(read_gguf(dense), n_ctx=64)
    with pytest.raises(ValueError, match="n_ctx must be >= 1"):
        gpu_footprint(read_gguf(dense), n_ctx=0)
