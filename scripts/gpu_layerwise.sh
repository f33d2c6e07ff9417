#!/usr/bin/env bash
# One device call (thirtieth session, run at b62a5de, where `specter-layerwise` was the
# variant: since then it is `specter`, and that `specter` is `specter-snapshot`): the CUDA
# tests of published routing counts (the kernel, the counter inside a graph, layer-wise
# plans from the graphed draft), then
# `specter-layerwise` against `specter` at DeepSeek-V2-Lite 24 GB in both orders (one
# process each, `lru` beside the first), 3 HumanEval prompts x 64 tokens.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_layerwise.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
cuda_tests_to gpu-tests.txt packages/specter-kernels/tests/test_gpu.py -k observe_and_publish
cuda_tests_to gpu-tests.txt packages/specter-cache/tests/test_expert_cache_cuda.py -k published
cuda_tests_to gpu-tests.txt packages/specter-models/tests/test_cuda.py \
    -k "layerwise or draft_step_has_no_host_sync or streamed_misses"
echo "tests done at $(($(date +%s) - begin)) s"
tpot_cells 200 24 specter,specter-layerwise,lru layerwise-24gb 3.0
echo "first pair done at $(($(date +%s) - begin)) s"
tpot_cells 160 24 specter-layerwise,specter layerwise-first-24gb 2.3
echo "done at $(($(date +%s) - begin)) s"
