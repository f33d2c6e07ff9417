#!/usr/bin/env bash
# One device call (twenty-eighth session): the CUDA tests of the held prefetch copies
# (specter-cache's CUDA tests, the models' streamed CUDA tests), then DeepSeek-V2-Lite at
# 24 GB with `specter` beside `specter-held` (4 loads before the launch, the rest after)
# and `specter-held0` (every data copy after it) and `lru`, one process; then 16 GB with
# `specter`, `lru` and `specter-plain-fill` (streamed plain decoding without a draft).
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_held_copies.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
cuda_tests_to gpu-tests.txt packages/specter-cache/tests/test_expert_cache_cuda.py
cuda_tests_to gpu-tests.txt packages/specter-models/tests/test_cuda.py -k "stream"
echo "tests done at $(($(date +%s) - begin)) s"
tail -n 2 "$out/gpu-tests.txt"
tpot_cells 260 24 specter,specter-held,specter-held0,lru held-24gb 4.2
echo "24 GB done at $(($(date +%s) - begin)) s"
tpot_cells 200 16 specter,lru,specter-plain-fill held-16gb 3.2
echo "done at $(($(date +%s) - begin)) s"
