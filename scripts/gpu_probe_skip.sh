#!/usr/bin/env bash
# One device call (twenty-fourth session): the adaptive depth skips probes of depths whose own
# measured costs lose to plain decoding even with every proposal accepted. The models'
# speculation-exactness CUDA tests, then DeepSeek-V2-Lite's unlimited cell (hf, lru, specter)
# and 24 GB cell (specter, lru, spec-lru), one process each.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_probe_skip.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
CUDA_TESTS_TIMEOUT=90 cuda_tests_to gpu-tests-probe-skip.txt \
    packages/specter-models/tests/test_cuda.py -k "speculation_is_exact or batch_invariant_rows"
echo "tests done at $(($(date +%s) - begin)) s"
tpot_cells 170 unlimited hf,lru,specter skip-unlimited 2.6
echo "unlimited done at $(($(date +%s) - begin)) s"
tpot_cells 170 24 specter,lru,spec-lru skip-24gb 2.4
echo "done at $(($(date +%s) - begin)) s"
