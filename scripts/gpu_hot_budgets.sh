#!/usr/bin/env bash
# The pinned hot set at the other budgets, and the baseline cells still missing, in two
# device calls (each under 10 minutes), on the GPU machine from the repository root:
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_hot_budgets.sh 1   # DeepSeek 16 GB, Qwen 20 GB,
#                                                                  # Qwen hf-offload at 14 GB
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_hot_budgets.sh 2   # Phi 40 GB, Phi lru and
#                                                                  # hf-offload at 32 GB
# Part 1 also reruns the hot set's CUDA tests. Each run has its own time limit, so a slow
# one leaves the others their time (an offload stage starts only with 3 minutes left of
# --max-minutes, hence its 3.5); results go to $OUT/bench-*.jsonl, logs to $OUT/log-*.txt.
set -uo pipefail
part="${1:-1}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export TRITON_INTERPRET=0
# shellcheck source=/dev/null
source scripts/gpu-env.sh
out="${OUT:-/tmp/specter-out}"
mkdir -p "$out"
systems=specter,specter-no-hot,spec-lru,lru

bench() {  # seconds, --max-minutes, tag, specter bench arguments...
    local seconds="$1" minutes="$2" tag="$3"
    shift 3
    timeout "$seconds" python3 -m specter_bench bench "$@" --out "$out" --tag "$tag" \
        --max-minutes "$minutes" 2>&1 \
        | tr '\r' '\n' | grep -v -E '^[a-z0-9.-]+: +[0-9]+%' >"$out/log-$tag.txt"
    grep -E '^\| [a-z]|hot set|skipped|Error' "$out/log-$tag.txt" | grep -v target | head -12
}

if [ "$part" = 1 ]; then
    {
        timeout 60 python3 -m pytest -q packages/specter-kernels/tests/test_gpu.py -k skips 2>&1 \
            | tail -3
        timeout 90 python3 -m pytest -q packages/specter-models/tests/test_cuda.py \
            -k "speculation_is_exact and phimoe" 2>&1 | grep -E '^E |passed|failed' | head -30
    } >"$out/gpu-tests.txt"
    cat "$out/gpu-tests.txt"
    bench 150 2.1 dsv2-16gb --model deepseek-v2-lite --experiment tpot --systems "$systems" \
        --budgets 16 --num-prompts 2 --max-new-tokens 64
    bench 170 2.4 qwen-20gb --model qwen1.5-moe --experiment tpot --systems "$systems" \
        --budgets 20 --num-prompts 2 --max-new-tokens 64
    bench 150 3.5 qwen-offload --model qwen1.5-moe --experiment offload --budgets 14 \
        --offload-new-tokens 8 --offload-prompts 1
else
    bench 160 2.2 phi-40gb --model phi-3.5-moe --experiment tpot --systems specter,specter-no-hot,lru \
        --budgets 40 --num-prompts 1 --max-new-tokens 32
    bench 170 2.4 phi-lru32 --model phi-3.5-moe --experiment tpot --systems lru --budgets 32 \
        --num-prompts 1 --max-new-tokens 32
    bench 230 3.5 phi-offload --model phi-3.5-moe --experiment offload --budgets 32 \
        --offload-new-tokens 4 --offload-prompts 1
fi
ls "$out"
