#!/usr/bin/env bash
# One device call (prepared in the thirteenth session, not yet run): Qwen1.5-MoE at 14 GB,
# where streaming lost to acquiring in the tenth session (a streamed miss does not enter the
# cache), with staged streaming beside both, on 3 HumanEval prompts x 64 tokens, in one
# process:
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_staging_qwen.sh
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
timeout 560 python3 -m specter_bench bench --experiment tpot --num-prompts 3 \
    --tag staging-14gb --max-minutes 8.6 --model qwen1.5-moe \
    --systems specter,specter-staged,specter-acquire,lru --budgets 14 --max-new-tokens 64 \
    --out "$out" >"$out/log-staging-qwen-14gb.txt" 2>&1
tr '\r' '\n' <"$out/log-staging-qwen-14gb.txt" | grep -E '^\| qwen|Error|skipped|staging' \
    | cut -c1-240 | head -30
