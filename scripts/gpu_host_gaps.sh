#!/usr/bin/env bash
# One device call (twenty-seventh session): scripts/host_gaps_probe.py on DeepSeek-V2-Lite at
# 24 GB with the hot set of the twenty-sixth session's final run, adaptive depth and K = 1:
# the host time the GPU waits through around each verification (GAPS_ARGS=--device-gaps:
# the device's idle between forwards instead, from events, with no synchronisation).
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_host_gaps.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
hot=benchmarks/results/bench-deepseek-v2-lite-2026-12-03-final-24gb.jsonl
for depth in ${GAPS_DEPTHS:-auto 1}; do
    timeout 150 python3 scripts/host_gaps_probe.py --hot-experts "$hot" --depth "$depth" \
        --tag "${GAPS_TAG:-gaps}-k$depth" --out "$out/host-gaps.jsonl" ${GAPS_ARGS:-} 2>&1 \
        | grep -vE "Warning|warn" | tail -2
done
