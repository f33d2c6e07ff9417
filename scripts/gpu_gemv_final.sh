#!/usr/bin/env bash
# One device call (twenty-second session, the last): the invariant GEMV for the target's and
# (the new default) the draft's linears, the router one program per expert. The models'
# CUDA transformers/exactness tests (the check now per position, seeded), DeepSeek-V2-Lite's
# resident steps at the defaults, then its unlimited cell (hf, lru, specter) and its 24 GB
# cell (specter, lru), one process each.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_gemv_final.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
CUDA_TESTS_TIMEOUT=60 cuda_tests_to gpu-tests-final.txt packages/specter-models/tests/test_cuda.py \
    -k "speculation_is_exact or batch_invariant_rows"
echo "tests done at $(($(date +%s) - begin)) s"
resident_steps final 32
echo "steps done at $(($(date +%s) - begin)) s"
tpot_cells 170 unlimited hf,lru,specter final-unlimited 2.6
echo "unlimited done at $(($(date +%s) - begin)) s"
tpot_cells 120 24 specter,lru final-24gb 1.9
echo "done at $(($(date +%s) - begin)) s"
