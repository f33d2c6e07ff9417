#!/usr/bin/env bash
# One device call: DeepSeek-V2-Lite at its low budget (16 GB) with `lru`, `specter`
# (streaming its missing experts) and `specter-acquire`, one `specter bench` process:
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_stream_16gb.sh
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
timeout 320 python3 -m specter_bench bench --experiment tpot --num-prompts 2 \
    --tag streamed-16gb --max-minutes 4.0 --model deepseek-v2-lite \
    --systems lru,specter,specter-acquire --budgets 16 --max-new-tokens 64 --out "$out" \
    >"$out/log-dsv2-16gb.txt" 2>&1
tr '\r' '\n' <"$out/log-dsv2-16gb.txt" | grep -E '^\| deep|Error|skipped' | cut -c1-220
