#!/usr/bin/env bash
# One device call (twenty-fifth session): two launches fewer per MoE layer. The routed pair
# sum joins the residual add (specter-kernels residual_add_routed_pairs,
# SPECTER_FUSED_PAIR_JOIN), and SwiGLU's silu_and_mul runs inside the down projection's GEMV
# (silu_mul_linear, SPECTER_SILU_MUL_GEMV). Their CUDA tests and the models' exactness
# tests; DeepSeek-V2-Lite's resident step times with both off and both on (one process an
# arm); then the unlimited cell (hf, lru, specter) and the 24 GB cell (specter, lru).
#
# The silu GEMV measured slower (every GEMV program recomputes the whole activation) and was
# removed after this call: the script needs commit 744d95b (its test file is gone since).
#
#   SPECTER_GIT_COMMIT=744d95b bash scripts/gpu_fused_joins.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
CUDA_TESTS_TIMEOUT=120 cuda_tests_to gpu-tests-fused-joins.txt \
    packages/specter-kernels/tests/test_gpu.py packages/specter-kernels/tests/test_silu_mul_linear.py \
    -k "routed_pairs or silu_mul or silu_and_mul or sum_routed"
CUDA_TESTS_TIMEOUT=120 cuda_tests_to gpu-tests-fused-joins.txt \
    packages/specter-models/tests/test_cuda.py -k "speculation_is_exact or batch_invariant_rows"
echo "tests done at $(($(date +%s) - begin)) s"
SPECTER_FUSED_PAIR_JOIN=0 SPECTER_SILU_MUL_GEMV=0 resident_steps joins-off 64
resident_steps joins-on 64
echo "steps done at $(($(date +%s) - begin)) s"
tpot_cells 170 unlimited hf,lru,specter joins-unlimited 2.6
echo "unlimited done at $(($(date +%s) - begin)) s"
tpot_cells 130 24 specter,lru joins-24gb 2.0
echo "done at $(($(date +%s) - begin)) s"
