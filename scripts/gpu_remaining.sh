#!/usr/bin/env bash
# The cells the fifth session could not reach, in one device call (about 8 minutes), on the
# GPU machine from the repository root:
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_remaining.sh
#
# 1. Phi-3.5-MoE `lru` at 32 GB                  -> $OUT/bench-phi-3.5-moe-lru32.jsonl
# 2. Qwen1.5-MoE `hf-offload` at 14 GB (8 tokens) -> $OUT/bench-qwen1.5-moe-offload.jsonl
# 3. Phi-3.5-MoE `hf-offload` at 32 GB (4 tokens) -> $OUT/bench-phi-3.5-moe-offload.jsonl
# Each part has its own time limit, so a slow part leaves the others their time; logs go to
# $OUT/log-remaining.txt.
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
log="$out/log-remaining.txt"

timeout 170 python3 -m specter_bench bench --model phi-3.5-moe --experiment tpot \
    --systems lru --budgets 32 --num-prompts 1 --max-new-tokens 32 --out "$out" \
    --tag lru32 --max-minutes 2.8 >>"$log" 2>&1
# The offload stage starts only with 3 minutes left of --max-minutes.
timeout 150 python3 -m specter_bench bench --model qwen1.5-moe --experiment offload \
    --budgets 14 --offload-new-tokens 8 --offload-prompts 1 --out "$out" --tag offload \
    --max-minutes 3.5 >>"$log" 2>&1
timeout 230 python3 -m specter_bench bench --model phi-3.5-moe --experiment offload \
    --budgets 32 --offload-new-tokens 4 --offload-prompts 1 --out "$out" --tag offload \
    --max-minutes 3.5 >>"$log" 2>&1
tr '\r' '\n' <"$log" | grep -E '^\| (phi|qwen)|skipped|Error' | grep -v 'target' | head -20
