#!/usr/bin/env bash
# One device call: the unlimited target cell of DeepSeek-V2-Lite (hf in transformers'
# fastest configuration, lru, specter) on 3 HumanEval prompts x 64 tokens, in one process:
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_fills_unlimited.sh
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
timeout 330 python3 -m specter_bench bench --experiment tpot --num-prompts 3 \
    --tag unlimited-final --max-minutes 4.4 --model deepseek-v2-lite \
    --systems hf,lru,specter --budgets unlimited --max-new-tokens 64 --out "$out" \
    >"$out/log-unlimited-final.txt" 2>&1
tr '\r' '\n' <"$out/log-unlimited-final.txt" | grep -E '^\| deep|Error|skipped' | cut -c1-240
