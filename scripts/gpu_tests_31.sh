#!/usr/bin/env bash
# One device call (thirty-first session): every CUDA test of specter-models and
# specter-cache at the session's final code (streamed verifications wait for their layer's
# prefetches by default).
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_tests_31.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
CUDA_TESTS_TIMEOUT=40 cuda_tests_to gpu-tests.txt packages/specter-cache/tests/test_expert_cache_cuda.py
CUDA_TESTS_TIMEOUT=200 cuda_tests_to gpu-tests.txt packages/specter-models/tests/test_cuda.py
echo "done at $(($(date +%s) - begin)) s"
