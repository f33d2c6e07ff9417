#!/usr/bin/env bash
# The thirty-first session's cells, two device calls (the second right after the first):
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_cells_31.sh 24      (carry .whl)
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_cells_31.sh unlimited
# 24: the models' CUDA tests of streamed verifications (waits now the default), then
# DeepSeek-V2-Lite at 24 GB with `specter`, `specter-no-wait`, `lru` and `spec-lru` in one
# process with the routing experiment (the Belady bound, policy hit rates, agreement).
# unlimited: `hf` (fastest configuration), `lru` and `specter`, one process.
# 3 HumanEval prompts x 64 tokens each.
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
if [ "${1:-24}" = 24 ]; then
    cuda_tests_to gpu-tests.txt packages/specter-models/tests/test_cuda.py \
        -k "stream_waits or streamed_misses or staged"
    echo "tests done at $(($(date +%s) - begin)) s"
    tpot_cells 420 24 specter,specter-no-wait,lru,spec-lru cells31-24gb 6.5 --experiment routing
else
    tpot_cells 200 unlimited hf,lru,specter cells31-unlimited 3.0
fi
echo "done at $(($(date +%s) - begin)) s"
