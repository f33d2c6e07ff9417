#!/usr/bin/env bash
# One device call (twenty-second session): the batch-invariant GEMV with the shipped H200
# tiles. The CUDA tests (the GEMV at real shapes, every invariant kernel's 512-row prefix
# check, the models' batch-invariant rows and exact speculation), DeepSeek-V2-Lite's
# resident steps, then its unlimited cell (hf, lru, specter, one process).
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_gemv_cells.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
CUDA_TESTS_TIMEOUT=120 cuda_tests_to gpu-tests-gemv.txt \
    packages/specter-kernels/tests/invariant/test_gpu_batch_invariance.py
CUDA_TESTS_TIMEOUT=150 cuda_tests_to gpu-tests-gemv.txt packages/specter-models/tests/test_cuda.py \
    -k "speculation_is_exact or batch_invariant_rows"
echo "tests done at $(($(date +%s) - begin)) s"
resident_steps gemv-shipped 32
echo "steps done at $(($(date +%s) - begin)) s"
tpot_cells 200 unlimited hf,lru,specter gemv-unlimited 2.9
echo "done at $(($(date +%s) - begin)) s"
