#!/usr/bin/env bash
# One device call (twentieth session, the last): the shared-overlap CUDA tests with the router
# in one launch and in two (the third call saw one piecewise DeepSeek-V2 draft capture fail
# with the router in one launch), then DeepSeek-V2-Lite's unlimited cell (hf, lru, specter in
# one process) and its 24 GB cell (specter, lru in one process) at this tree's defaults.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_final_cells.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
for router in 1 0; do
    echo "router one launch: $router"
    SPECTER_ROUTER_ONE_LAUNCH=$router CUDA_TESTS_TIMEOUT=100 \
        cuda_tests_to "gpu-tests-final-router-$router.txt" \
        packages/specter-models/tests/test_cuda.py -k "shared_overlap or graphed_speculation"
done
echo "tests done at $(($(date +%s) - begin)) s"
tpot_cells 210 unlimited hf,lru,specter final-unlimited 3.0
echo "unlimited done at $(($(date +%s) - begin)) s"
tpot_cells 200 24 specter,lru final-24gb 2.8
echo "done at $(($(date +%s) - begin)) s"
