#!/usr/bin/env bash
# One device call (twenty-sixth session): the draft lookahead (the draft runs once more over
# its last proposal so the prefetcher plans every verified row's experts). The models' CUDA
# exactness tests under budgets, then DeepSeek-V2-Lite at 24 GB and 16 GB with specter
# (lookahead on), specter-no-lookahead and lru in one process a budget, 3 HumanEval prompts
# x 64 tokens.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_lookahead.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
CUDA_TESTS_TIMEOUT=200 cuda_tests_to gpu-tests-2026-12-03-lookahead.txt \
    packages/specter-models/tests/test_cuda.py \
    -k "speculation_is_exact or batch_invariant_rows or graphed_speculation or hot_set_draft or streamed_misses"
echo "tests done at $(($(date +%s) - begin)) s"
tpot_cells 230 24 specter,specter-no-lookahead,lru lookahead-24gb 3.6
echo "24 GB done at $(($(date +%s) - begin)) s"
tpot_cells 200 16 specter,specter-no-lookahead,lru lookahead-16gb 3.0
echo "done at $(($(date +%s) - begin)) s"
