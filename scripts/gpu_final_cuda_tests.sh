#!/usr/bin/env bash
# One short device call: every CUDA test of specter-kernels (test_gpu.py), specter-cache and
# specter-models at the final code.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_final_cuda_tests.sh
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
timeout 40 python3 -m pytest -q -p no:cacheprovider \
    packages/specter-cache/tests/test_expert_cache_cuda.py 2>&1 | tail -1 \
    | tee "$out/gpu-tests-cache.txt"
timeout 130 python3 -m pytest -q -p no:cacheprovider packages/specter-models/tests/test_cuda.py \
    -rfE --tb=short 2>&1 | tee "$out/gpu-tests-models-all.txt" | tail -3
timeout 60 python3 -m pytest -q -p no:cacheprovider packages/specter-kernels/tests/test_gpu.py \
    2>&1 | tail -1 | tee "$out/gpu-tests-kernels.txt"
