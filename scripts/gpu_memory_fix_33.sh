#!/usr/bin/env bash
# One device call (thirty-third session): the piecewise captures on one stream. The CUDA
# tests of the piecewise graphs (the new one-stream test and the budgeted decode-like-eager
# ones), then memory_peak_probe.py for `lru` and `spec-lru` at DeepSeek-V2-Lite 24 GB (before:
# 24.65 / 24.87 GB at the capture's peak against plans of 23.64 / 23.86, 33 cuBLAS
# workspaces of 32 MiB live from `_window_forward`).
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_memory_fix_33.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
CUDA_TESTS_TIMEOUT=120 cuda_tests_to gpu-tests.txt packages/specter-models/tests/test_cuda.py \
    -k "piecewise"
echo "tests done at $(($(date +%s) - begin)) s"
for system in lru spec-lru; do
    timeout 110 python3 scripts/memory_peak_probe.py --system "$system" --budget-gb 24 \
        --tokens 8 --largest 4 --out "$out/memory-fixed-$system.json" \
        >"$out/log-memory-fixed-$system.txt" 2>&1
    echo "== $system (rc $?) at $(($(date +%s) - begin)) s"
    python3 -c "import json; d=json.load(open('$out/memory-fixed-$system.json')); \
print('plan', round(d['plan_gb']['expected_peak_bytes'], 3), 'max allocated', \
round(d['max_allocated_gb'], 3), 'max reserved', round(d['max_reserved_gb'], 3)); \
[print(k, round(d[k]['peak_gb'], 3), d[k]['by_site'][:5]) for k in ('load', 'load+capture', 'whole')]" \
        2>&1 | cut -c1-700
done
echo "done at $(($(date +%s) - begin)) s"
