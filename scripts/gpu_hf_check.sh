#!/usr/bin/env bash
# One device call: DeepSeek-V2-Lite unlimited, hf in two experts configurations beside
# specter and lru, each in its own process (every target ratio within one run):
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_hf_check.sh
#
# 1. --hf-decode-experts batched_mm_prompt_too (transformers' batched_mm, prompt included)
# 2. --hf-decode-experts batched_mm (batched_mm decode steps, grouped_mm prompt)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
for experts in batched_mm_prompt_too batched_mm; do
    timeout 200 python3 -m specter_bench bench --model deepseek-v2-lite --experiment tpot \
        --systems hf,specter,lru --budgets unlimited --num-prompts 2 --max-new-tokens 64 \
        --hf-decode-experts "$experts" --out "$out" --tag "hf-$experts" --max-minutes 2.8 2>&1 \
        | tr '\r' '\n' | grep -v -E '^deepseek-v2-lite: +[0-9]+%' >"$out/log-hf-$experts.txt"
    grep -E '^\| deep|Error' "$out/log-hf-$experts.txt" | head -8
done
