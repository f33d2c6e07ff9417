#!/usr/bin/env bash
# One device call (prepared in the thirteenth session, not yet run): DeepSeek-V2-Lite's
# 24 GB target cells (lru, spec-lru, specter, the Belady bound) with specter-staged beside
# them, on 3 HumanEval prompts x 64 tokens, in one process:
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_staging_targets.sh
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
timeout 560 python3 -m specter_bench bench --experiment routing --num-prompts 3 \
    --tag staging-24gb --max-minutes 8.6 --model deepseek-v2-lite \
    --systems specter,specter-staged,lru,spec-lru --budgets 24 --max-new-tokens 64 \
    --out "$out" >"$out/log-staging-24gb.txt" 2>&1
tr '\r' '\n' <"$out/log-staging-24gb.txt" | grep -E '^\| deep|Error|skipped|staging' \
    | cut -c1-240 | head -30
