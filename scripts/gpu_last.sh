#!/usr/bin/env bash
# One device call (under 8 minutes), each part under its own time limit:
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_last.sh
#
# 1. DeepSeek-V2-Lite unlimited: hf (warmed on each prompt), lru, specter   -> *-unlimited.jsonl
# 2. DeepSeek-V2-Lite 24 GB: specter and its ablations, hot set loaded      -> *-ablations.jsonl
# 3. Qwen1.5-MoE 14 GB: lru and specter with its hot set                    -> *-hot14.jsonl
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
part() {  # seconds, tag, then specter bench arguments
    local seconds="$1" tag="$2"
    shift 2
    timeout "$seconds" python3 -m specter_bench bench --experiment tpot --num-prompts 2 \
        --out "$out" --tag "$tag" --max-minutes "$(python3 -c "print(($seconds - 25) / 60)")" \
        "$@" 2>&1 | tr '\r' '\n' | grep -v -E ': +[0-9]+%' >"$out/log-$tag.txt"
    grep -E '^\| (deep|qwen)|Error|skipped' "$out/log-$tag.txt" | head -12
}
part 175 unlimited --model deepseek-v2-lite --systems hf,lru,specter --budgets unlimited \
    --max-new-tokens 64
part 170 ablations --model deepseek-v2-lite --budgets 24 --max-new-tokens 64 --systems \
    specter,specter-no-hot,specter-no-prefetch,specter-token-verify,specter-row-cut
part 120 hot14 --model qwen1.5-moe --systems lru,specter --budgets 14 --max-new-tokens 64
