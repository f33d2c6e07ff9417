#!/usr/bin/env bash
# One device call (thirty-ninth session): the MLA key chunk at 32 with the block merge (the
# new defaults) against 64 walked (SPECTER_MLA_SPLIT=64 SPECTER_MLA_VECTOR_MERGE=0, the
# defaults before). The kernels' MLA CUDA tests and the models' exactness/graph CUDA tests;
# DeepSeek-V2-Lite unlimited plain decoding (`lru`, 3 HumanEval prompts x 64 tokens), arms in
# turn: new, old, new; then the unlimited cell (`hf` in its fastest configuration and
# `specter`) at the new defaults. One process an arm.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_split32_39.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
CUDA_TESTS_TIMEOUT=60 cuda_tests_to gpu-tests-2026-12-04-split39.txt \
    packages/specter-kernels/tests/test_gpu.py -k "mla"
CUDA_TESTS_TIMEOUT=120 cuda_tests_to gpu-tests-2026-12-04-split39.txt \
    packages/specter-models/tests/test_cuda.py -k "speculation_is_exact or graphed_speculation"
echo "== tests at $(($(date +%s) - begin)) s"
for arm in new old new2; do
    if [[ $arm == old ]]; then
        SPECTER_MLA_SPLIT=64 SPECTER_MLA_VECTOR_MERGE=0 tpot_cells 90 unlimited lru \
            "split-$arm-unlimited" 1.4
    else
        tpot_cells 90 unlimited lru "split-$arm-unlimited" 1.4
    fi
    echo "== $arm at $(($(date +%s) - begin)) s"
done
tpot_cells 170 unlimited hf,specter split-cells-unlimited 2.5
echo "== cells at $(($(date +%s) - begin)) s"
