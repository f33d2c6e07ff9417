#!/usr/bin/env bash
# One device call (twenty-third session): the PDL and GEMV CUDA tests at the new defaults
# (PDL `early`, the constant-weight GEMV preload, the 1/2-warp tiles), then Qwen1.5-MoE's
# unlimited cell (hf, lru, specter) and its 20 GB cell (specter, lru), one process each.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_early_qwen.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
CUDA_TESTS_TIMEOUT=120 cuda_tests_to gpu-tests-early-kernels.txt \
    packages/specter-kernels/tests/test_pdl.py packages/specter-kernels/tests/invariant/test_gpu_batch_invariance.py
echo "tests done at $(($(date +%s) - begin)) s"
model_cells qwen1.5-moe 170 unlimited hf,lru,specter qwen-early-unlimited 2.5
echo "unlimited done at $(($(date +%s) - begin)) s"
model_cells qwen1.5-moe 140 20 specter,lru qwen-early-20gb 2.0
echo "done at $(($(date +%s) - begin)) s"
