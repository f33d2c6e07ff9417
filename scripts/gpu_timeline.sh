#!/usr/bin/env bash
# One device call: scripts/timeline_probe.py on DeepSeek-V2-Lite at 24 GB with the pinned hot
# set of the eb57a07 targets run, fixed K = 6: kernel, copy-engine and idle time per phase.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_timeline.sh
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
timeout 200 python3 scripts/timeline_probe.py --depth 6 --out "$out/timeline-probe.jsonl" \
    --hot-experts benchmarks/results/bench-deepseek-v2-lite-2026-12-01-batched-prefetch-24gb.jsonl \
    2>&1 | grep -vE "Warning|warn" | tail -5
