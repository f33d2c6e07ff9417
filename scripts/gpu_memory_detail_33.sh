#!/usr/bin/env bash
# One device call (thirty-third session): gpu_memory_33.sh found DeepSeek-V2-Lite's `lru` and
# `spec-lru` loads within their plan at 24 GB (23.34 / 23.56 GB against 23.64 / 23.86) and
# 1.3 GB over it once their graphs are captured (1.1 GB live from `_window_forward`, 33
# allocations), where `specter`'s capture adds 0.17 GB. This lists the largest allocations
# live at the capture's peak, with their frames, and the target graphs' keys, for `lru`.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_memory_detail_33.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
for system in ${MEMORY_SYSTEMS:-lru}; do
    timeout 120 python3 scripts/memory_peak_probe.py --system "$system" --budget-gb 24 \
        --tokens 8 --largest 16 --out "$out/memory-detail-$system.json" \
        >"$out/log-memory-detail-$system.txt" 2>&1
    echo "== $system (rc $?) at $(($(date +%s) - begin)) s"
    python3 -c "import json; d=json.load(open('$out/memory-detail-$system.json')); \
print('max allocated', round(d['max_allocated_gb'], 3), 'max reserved', round(d['max_reserved_gb'], 3)); \
print('graphs', d['graphs']); print('keys', d.get('target_keys')); \
[print(x) for x in d['load+capture']['largest']]" 2>&1 | cut -c1-700
done
echo "done at $(($(date +%s) - begin)) s"
