#!/usr/bin/env bash
# The pinned hot set at two more budgets in one device call (under 10 minutes), on the GPU
# machine from the repository root:
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_hot_budgets.sh
#
# 1. the skipped-pairs GPU test, and the tiny-Phi exactness CUDA test with its messages
#                                                                 -> $OUT/gpu-tests.txt
# 2. DeepSeek-V2-Lite at 16 GB and Qwen1.5-MoE at 20 GB: specter (its chosen hot set),
#    specter-no-hot, spec-lru and lru side by side              -> $OUT/bench-*.jsonl
# Each run has its own time limit, so a slow one leaves the others their time; logs go to
# $OUT/log-*.txt. The baseline cells still missing are scripts/gpu_remaining.sh.
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
systems=specter,specter-no-hot,spec-lru,lru

bench() {  # seconds, --max-minutes, tag, specter bench arguments...
    local seconds="$1" minutes="$2" tag="$3"
    shift 3
    timeout "$seconds" python3 -m specter_bench bench "$@" --out "$out" --tag "$tag" \
        --max-minutes "$minutes" 2>&1 \
        | tr '\r' '\n' | grep -v -E '^[a-z0-9.-]+: +[0-9]+%' >"$out/log-$tag.txt"
    grep -E '^\| [a-z]|hot set|skipped|Error' "$out/log-$tag.txt" | grep -v target | head -12
}

{
    timeout 60 python3 -m pytest -q packages/specter-kernels/tests/test_gpu.py -k skips 2>&1 \
        | tail -3
    timeout 90 python3 -m pytest -q packages/specter-models/tests/test_cuda.py \
        -k "speculation_is_exact and phimoe" 2>&1 | grep -E '^E |passed|failed' | head -30
} >"$out/gpu-tests.txt"
cat "$out/gpu-tests.txt"
bench 200 2.9 dsv2-16gb --model deepseek-v2-lite --experiment tpot --systems "$systems" \
    --budgets 16 --num-prompts 2 --max-new-tokens 64
bench 200 2.9 qwen-20gb --model qwen1.5-moe --experiment tpot --systems "$systems" \
    --budgets 20 --num-prompts 2 --max-new-tokens 64
ls "$out"
