#!/usr/bin/env bash
# One device call (twenty-fifth session): SwiGLU's silu_and_mul in the gate/up projection's
# GEMV (specter-kernels swiglu_linear, SPECTER_SWIGLU_GEMV), each program storing
# silu(gate) * up for its own columns. Its CUDA tests and the models' exactness tests;
# DeepSeek-V2-Lite's resident steps in the order off, on, off (one process an arm, the pair
# join on in all); then the unlimited cell (hf, lru, specter) with both on.
#
# It measured no gain (the one-row target step 2.148 ms against 2.201 and 2.147 without, the
# draft 1.948 against 1.915 and 1.933) and was removed after this call: the script needs
# commit c96d2da (its test file is gone since).
#
#   SPECTER_GIT_COMMIT=c96d2da bash scripts/gpu_swiglu_gemv.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
CUDA_TESTS_TIMEOUT=120 cuda_tests_to gpu-tests-swiglu-gemv.txt \
    packages/specter-kernels/tests/test_swiglu_linear.py packages/specter-kernels/tests/test_gpu.py \
    -k "swiglu or gemv or silu_and_mul or routed_pairs"
CUDA_TESTS_TIMEOUT=120 cuda_tests_to gpu-tests-swiglu-gemv.txt \
    packages/specter-models/tests/test_cuda.py -k "speculation_is_exact or batch_invariant_rows"
echo "tests done at $(($(date +%s) - begin)) s"
resident_steps_ab SPECTER_SWIGLU_GEMV swiglu 64
echo "steps done at $(($(date +%s) - begin)) s"
tpot_cells 170 unlimited hf,lru,specter swiglu-unlimited 2.6
echo "done at $(($(date +%s) - begin)) s"
