#!/usr/bin/env bash
# One device call: zero-copy read bandwidth from pinned host memory (scripts/zero_copy_probe.py),
# then where a 24 GB DeepSeek-V2-Lite decode's host time goes on a HumanEval prompt with
# the benchmark's hot set (scripts/profile_decode_host.py):
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_zero_copy.sh
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
timeout 120 python3 scripts/zero_copy_probe.py 2>&1 | tee "$out/zero-copy-probe.txt"
timeout 300 python3 scripts/profile_decode_host.py --budget-gb 24 --humaneval 0 --depth auto \
    --top 45 --hot-experts benchmarks/results/bench-deepseek-v2-lite-2026-12-01-pair-waves.jsonl \
    >"$out/profile-decode-host-24gb-humaneval.txt" 2>&1
grep -E "TPOT|built" "$out/profile-decode-host-24gb-humaneval.txt" | cut -c1-400
