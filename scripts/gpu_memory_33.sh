#!/usr/bin/env bash
# Prepared in the thirty-second session, run in the thirty-third (docs/benchmarks.md,
# "Thirty-third session": the capture, not the load, went over; fixed in bda5854): what is
# live on the GPU at the peaks of the bench's loads that overshoot their plan. DeepSeek-V2-Lite
# at 24 GB, one fresh process a system (scripts/memory_peak_probe.py: the allocator's history
# replayed to each phase's peak, the live bytes grouped by the repository frame that
# allocated them): `lru` (24.49 GB at load in the bench against 23.64 planned), `spec-lru`
# (25.04 in its decode) and `specter` (within its plan, for comparison).
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_memory_33.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
for system in lru spec-lru specter; do
    timeout 150 python3 scripts/memory_peak_probe.py --system "$system" --budget-gb 24 \
        --out "$out/memory-peak-$system.json" >"$out/log-memory-$system.txt" 2>&1
    echo "== $system (rc $?) at $(($(date +%s) - begin)) s"
    python3 -c "import json; d=json.load(open('$out/memory-peak-$system.json')); \
print('plan expected', round(d['plan_gb'].get('expected_peak_bytes', 0), 3), 'max allocated', \
round(d['max_allocated_gb'], 3)); [print(k, round(d[k]['peak_gb'], 3), d[k]['by_site'][:6]) \
for k in ('load', 'load+capture', 'whole')]" 2>&1 | cut -c1-900
done
echo "done at $(($(date +%s) - begin)) s"
