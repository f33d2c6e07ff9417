#!/usr/bin/env bash
# One device call (thirteenth session): the CUDA tests the review commit e0c15dd touched
# (specter-cache's, and specter-models' streamed, budget and hot tests), then the
# streamed-GEMM probe (scripts/gpu_streamed_gemm.sh).
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_streamed_gemm_tests.sh
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
cuda_tests_to gpu-tests-streamed-gemm.txt packages/specter-cache/tests/test_expert_cache_cuda.py
cuda_tests_to gpu-tests-streamed-gemm.txt packages/specter-models/tests/test_cuda.py \
    -k "streamed or budget or hot"
bash scripts/gpu_streamed_gemm.sh
