#!/usr/bin/env bash
# One device call (prepared in the twenty-seventh session, not yet run): the CUDA tests that
# cover the code changed after that session's last call (specter-cache's CUDA tests, the
# models' streamed and budget CUDA tests), then host_gaps_probe.py --device-gaps on
# DeepSeek-V2-Lite at 24 GB (adaptive depth and K = 1): the device's idle between forwards,
# from events, with no synchronisation.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_device_gaps.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
cuda_tests_to gpu-tests.txt packages/specter-cache/tests/test_expert_cache_cuda.py
cuda_tests_to gpu-tests.txt packages/specter-models/tests/test_cuda.py -k "stream or budget"
echo "tests done at $(($(date +%s) - begin)) s"
(export GAPS_ARGS=--device-gaps GAPS_TAG=device && bash scripts/gpu_host_gaps.sh)
echo "done at $(($(date +%s) - begin)) s"
