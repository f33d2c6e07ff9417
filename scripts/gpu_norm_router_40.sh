#!/usr/bin/env bash
# One device call (fortieth session), run at 2647685 (its code measured 4% slower and was
# removed): the post-attention add_rms_norm and the router in one launch
# (SPECTER_NORM_ROUTER, on by default there). The kernels' router/norm CUDA tests and the
# models' norm-router/exactness CUDA tests; DeepSeek-V2-Lite unlimited plain decoding (`lru`,
# 3 HumanEval prompts x 64 tokens), arms in turn: one launch, two launches, one launch; then,
# if the call has time left, the unlimited cell (hf, lru, specter) in one process.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_norm_router_40.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
CUDA_TESTS_TIMEOUT=60 cuda_tests_to gpu-tests-norm-router40.txt \
    packages/specter-kernels/tests/test_gpu.py -k "router or add_rms_norm"
CUDA_TESTS_TIMEOUT=150 cuda_tests_to gpu-tests-norm-router40.txt \
    packages/specter-models/tests/test_cuda.py -k "norm_launch or speculation_is_exact"
echo "== tests at $(($(date +%s) - begin)) s"
switch_arms SPECTER_NORM_ROUTER normrouter one apart
if (($(date +%s) - begin < 290)); then
    tpot_cells 170 unlimited hf,lru,specter normrouter-cells-unlimited 2.6
    echo "== cells at $(($(date +%s) - begin)) s"
fi
