#!/usr/bin/env bash
# One device call (twenty-third session, the last): PDL `early` with the GEMV preload as the
# defaults. The models' CUDA transformers/exactness tests, then DeepSeek-V2-Lite's
# unlimited cell (hf, lru, specter) and 24 GB cell (specter, lru, spec-lru), one process each.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_early_cells.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
CUDA_TESTS_TIMEOUT=90 cuda_tests_to gpu-tests-early-defaults.txt \
    packages/specter-models/tests/test_cuda.py -k "speculation_is_exact or batch_invariant_rows" \
    packages/specter-kernels/tests/test_pdl.py
echo "tests done at $(($(date +%s) - begin)) s"
tpot_cells 170 unlimited hf,lru,specter early-unlimited 2.6
echo "unlimited done at $(($(date +%s) - begin)) s"
tpot_cells 170 24 specter,lru,spec-lru early-24gb 2.4
echo "done at $(($(date +%s) - begin)) s"
