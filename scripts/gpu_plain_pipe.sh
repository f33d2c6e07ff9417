#!/usr/bin/env bash
# One device call (prepared in the twenty-ninth session, not yet run): the CUDA tests of
# the streamed paths after pipelined stream records and all_resident's settle change, then
# `specter-plain-pipe` against `specter-plain-fill` (both orders, one process each pair) on
# Qwen1.5-MoE at 14 GB and DeepSeek-V2-Lite at 16 GB, 3 HumanEval prompts x 64 tokens.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_plain_pipe.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
cuda_tests_to gpu-tests.txt packages/specter-models/tests/test_cuda.py -k "stream or captured"
cuda_tests_to gpu-tests.txt packages/specter-cache/tests/test_expert_cache_cuda.py
echo "tests done at $(($(date +%s) - begin)) s"
model_cells qwen1.5-moe 200 14 specter-plain-fill,specter-plain-pipe pipe-qwen-14gb 3.0
model_cells qwen1.5-moe 200 14 specter-plain-pipe,specter-plain-fill pipe-first-qwen-14gb 3.0
tpot_cells 200 16 specter-plain-fill,specter-plain-pipe pipe-16gb 3.0
echo "done at $(($(date +%s) - begin)) s"
