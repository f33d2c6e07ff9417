#!/usr/bin/env bash
# One device call (thirty-first session, run at 6fc8c17 and 665e6ac, where `specter-wait`
# was the waiting variant: since 6fef803 `specter` waits and `specter-no-wait` does not, so
# at today's code this compares `specter` with itself): the CUDA tests of captured landing
# waits (the cache's external-event wait inside a graph, the models' graphed verifications
# with stream_waits), then `specter-wait` against `specter` at DeepSeek-V2-Lite 24 GB in
# both orders (one process each, `lru` beside the first), 3 HumanEval prompts x 64 tokens.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_waits.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
cuda_tests_to gpu-tests.txt packages/specter-cache/tests/test_expert_cache_cuda.py
cuda_tests_to gpu-tests.txt packages/specter-models/tests/test_cuda.py \
    -k "stream_waits or layerwise or streamed_misses"
echo "tests done at $(($(date +%s) - begin)) s"
tpot_cells 200 24 specter,specter-wait,lru waits-24gb 3.0
echo "first pair done at $(($(date +%s) - begin)) s"
tpot_cells 160 24 specter-wait,specter waits-first-24gb 2.3
echo "done at $(($(date +%s) - begin)) s"
