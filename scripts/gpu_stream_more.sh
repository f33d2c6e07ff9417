#!/usr/bin/env bash
# One device call after the streamed miss path's targets run: Qwen1.5-MoE at 14 GB with
# `lru`, `specter` (streaming) and `specter-acquire`, then DeepSeek-V2-Lite unlimited with
# `lru` and `specter` (nothing streams there), each a `specter bench` process:
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_stream_more.sh
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
timeout 200 python3 -m specter_bench bench --experiment tpot --num-prompts 2 \
    --tag qwen-streamed-14gb --max-minutes 2.6 --model qwen1.5-moe \
    --systems lru,specter,specter-acquire --budgets 14 --max-new-tokens 64 --out "$out" \
    >"$out/log-qwen-streamed.txt" 2>&1
tr '\r' '\n' <"$out/log-qwen-streamed.txt" | grep -E '^\| qwen|Error|skipped' | cut -c1-220
timeout 170 python3 -m specter_bench bench --experiment tpot --num-prompts 2 \
    --tag unlimited-streamed --max-minutes 2.2 --model deepseek-v2-lite \
    --systems lru,specter --budgets unlimited --max-new-tokens 64 --out "$out" \
    >"$out/log-dsv2-unlimited.txt" 2>&1
tr '\r' '\n' <"$out/log-dsv2-unlimited.txt" | grep -E '^\| deep|Error|skipped' | cut -c1-220
