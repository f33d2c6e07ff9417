#!/usr/bin/env bash
# One device call after the adaptive depth's probe back-off: DeepSeek-V2-Lite at 24 GB
# (lru, specter) and unlimited (hf, lru, specter), 3 HumanEval prompts x 64 tokens, one
# process per budget:
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_backoff.sh
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
run() {
    local budget=$1 systems=$2 tag=$3 minutes=$4
    timeout 200 python3 -m specter_bench bench --experiment tpot --num-prompts 3 \
        --tag "$tag" --max-minutes "$minutes" --model deepseek-v2-lite --systems "$systems" \
        --budgets "$budget" --max-new-tokens 64 --out "$out" >"$out/log-$tag.txt" 2>&1
    tr '\r' '\n' <"$out/log-$tag.txt" | grep -E '^\| deep|Error|skipped' | cut -c1-200
}
run unlimited hf,lru,specter backoff-unlimited 2.6
run 24 lru,specter backoff-24gb 2.6
