#!/usr/bin/env bash
# One device call (thirty-seventh session): the shared experts' weights asked into the L2 at
# each layer's start on the side stream, while the attention runs (SPECTER_SHARED_L2_PREFETCH).
# The l2_prefetch CUDA test, then DeepSeek-V2-Lite unlimited plain decoding (`lru`: every
# expert resident, no draft probes, so the arms differ by the prefetch only), arms in turn,
# one process an arm, 3 HumanEval prompts x 64 tokens.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_l2_prefetch_37.sh   (carry .whl; the prefetch is
#   in commit b3afe6a only, reverted after this measurement: check it out first)
#   ARMS="off prefetch-all-32 ..." picks arms: mode-parts-programs, or off.
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
CUDA_TESTS_TIMEOUT=120 cuda_tests_to gpu-tests-l2-prefetch.txt \
    packages/specter-kernels/tests/test_gpu.py -k "l2_prefetch"
echo "== tests at $(($(date +%s) - begin)) s"
for arm in ${ARMS:-off prefetch-all-32 prefetch-first-32 load-all-32 off2 prefetch-all-64}; do
    mode=0 parts=all programs=32
    if [[ $arm != off* ]]; then
        IFS=- read -r mode parts programs <<<"$arm"
    fi
    SPECTER_SHARED_L2_PREFETCH=$mode SPECTER_SHARED_L2_PREFETCH_PARTS=$parts \
        SPECTER_SHARED_L2_PREFETCH_PROGRAMS=$programs \
        tpot_cells 100 unlimited lru "l2-$arm-unlimited" 1.5
    echo "== $arm at $(($(date +%s) - begin)) s"
done
