#!/usr/bin/env bash
# One device call: streamed fills A/B at a fixed depth (K = 6, so the adaptive depth's
# choices do not confound it), `specter` against `specter-no-fill` in one process per model,
# DeepSeek-V2-Lite at 24 GB (no-fill first) and Qwen1.5-MoE at 14 GB (fills first):
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_fills_ab.sh
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
run() {
    local model=$1 budget=$2 systems=$3 tag=$4
    timeout 260 python3 -m specter_bench bench --experiment tpot --num-prompts 2 --depth 6 \
        --tag "$tag" --max-minutes 3.4 --model "$model" --systems "$systems" \
        --budgets "$budget" --max-new-tokens 64 --out "$out" >"$out/log-$tag.txt" 2>&1
    tr '\r' '\n' <"$out/log-$tag.txt" | grep -E '^\| (deep|qwen)|Error|skipped' | cut -c1-200
}
run deepseek-v2-lite 24 specter-no-fill,specter fills-ab-24gb
run qwen1.5-moe 14 specter,specter-no-fill fills-ab-14gb
