#!/usr/bin/env bash
# One device call (twentieth session, after gpu_value_projection.sh): the router in one
# launch, and the value projection one row per program. In order: the CUDA tests (the router
# against its two launches, 200 launches and graph replays; the value projection, fused
# residuals and MLA prologue; the tiny models' speculative greedy equal to plain); the
# attention block apart and fused (bench_mla_projection.py); DeepSeek-V2-Lite resident step
# times with the router in two launches and in one (SPECTER_ROUTER_ONE_LAUNCH), one process
# per arm, interleaved.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_router_one_launch.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
CUDA_TESTS_TIMEOUT=220 cuda_tests_to gpu-tests-router-one-launch.txt \
    packages/specter-kernels/tests/test_gpu.py -k "router or mla or fused_residual" \
    packages/specter-models/tests/test_cuda.py \
    -k "value_projection or fused_residuals or speculation_is_exact or shared_overlap"
echo "tests done at $(($(date +%s) - begin)) s"
mla_projection_bench
echo "bench done at $(($(date +%s) - begin)) s"
for arm in 0 1 0b 1b; do
    SPECTER_ROUTER_ONE_LAUNCH=${arm%b} resident_steps "router-$arm" 32
done
echo "done at $(($(date +%s) - begin)) s"
