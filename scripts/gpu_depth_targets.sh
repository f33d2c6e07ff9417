#!/usr/bin/env bash
# One device call (fourteenth session) after the adaptive depth's measured per-depth costs:
# DeepSeek-V2-Lite's 24 GB cells (specter, lru, spec-lru) in one process, then the unlimited
# ones (hf, lru, specter) in another, 3 HumanEval prompts x 64 tokens each:
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_depth_targets.sh
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
run() {
    local budget=$1 systems=$2 tag=$3 minutes=$4
    timeout 170 python3 -m specter_bench bench --experiment tpot --num-prompts 3 \
        --tag "$tag" --max-minutes "$minutes" --model deepseek-v2-lite --systems "$systems" \
        --budgets "$budget" --max-new-tokens 64 --out "$out" >"$out/log-$tag.txt" 2>&1
    tr '\r' '\n' <"$out/log-$tag.txt" | grep -E '^\| deep|Error|skipped' | cut -c1-200
}
run 24 specter,lru,spec-lru depth-24gb 2.6
run unlimited hf,lru,specter depth-unlimited 2.2
