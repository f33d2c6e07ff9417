#!/usr/bin/env bash
# One device call (twentieth session, after gpu_fused_residuals.sh): DeepSeek-V2's value
# up-projection inside the MLA merge kernel. In order: the CUDA tests (the fused projection
# at DeepSeek-V2-Lite's sizes; the tiny model with it: close to the bmm, rows alone equal
# rows together, speculative greedy equal to plain; the fused residuals and the MLA
# prologue beside them); the attention block apart and fused (bench_mla_projection.py);
# DeepSeek-V2-Lite resident step times with the projection apart and fused
# (SPECTER_MLA_FUSED_UV), one process per arm, interleaved; the unlimited cell (hf, lru,
# specter in one process) at this tree's defaults.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_value_projection.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
CUDA_TESTS_TIMEOUT=200 cuda_tests_to gpu-tests-value-projection.txt \
    packages/specter-kernels/tests/test_gpu.py -k "mla or fused_residual" \
    packages/specter-models/tests/test_cuda.py \
    -k "value_projection or fused_residuals or mla_prologue or speculation_is_exact"
echo "tests done at $(($(date +%s) - begin)) s"
mla_projection_bench
echo "bench done at $(($(date +%s) - begin)) s"
for arm in 0 1 0b 1b; do
    SPECTER_MLA_FUSED_UV=${arm%b} resident_steps "uv-$arm" 32
done
echo "steps done at $(($(date +%s) - begin)) s"
tpot_cells 200 unlimited hf,lru,specter uv-unlimited 2.8
echo "done at $(($(date +%s) - begin)) s"
