#!/usr/bin/env bash
# One device call: every CUDA test of specter-kernels (test_gpu.py), specter-cache and
# specter-models (test_cuda.py) at the current code:
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_cuda_suites.sh
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
cuda_tests_to gpu-tests-cuda-suites.txt packages/specter-kernels/tests/test_gpu.py
cuda_tests_to gpu-tests-cuda-suites.txt packages/specter-cache/tests/test_expert_cache_cuda.py
cuda_tests_to gpu-tests-cuda-suites.txt packages/specter-models/tests/test_cuda.py
