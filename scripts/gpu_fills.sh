#!/usr/bin/env bash
# One device call for streamed fills: their CUDA tests (kernels, cache, models), then
# DeepSeek-V2-Lite at 24 GB with `lru`, `specter` (streaming with fills) and
# `specter-no-fill` (streaming without) in one process:
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_fills.sh
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
cuda_tests() {
    timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE --tb=short "$@" 2>&1 \
        | tail -4 | tee -a "$out/gpu-tests-fills.txt"
}
cuda_tests packages/specter-kernels/tests/test_gpu.py -k "fills or streamed"
cuda_tests packages/specter-cache/tests/test_expert_cache_cuda.py
cuda_tests packages/specter-models/tests/test_cuda.py -k streamed
timeout "${BENCH_TIMEOUT:-330}" python3 -m specter_bench bench --experiment tpot \
    --num-prompts 2 --tag fills-24gb --max-minutes "${BENCH_MINUTES:-4.5}" \
    --model deepseek-v2-lite --systems lru,specter,specter-no-fill --budgets 24 \
    --max-new-tokens 64 --out "$out" >"$out/log-fills-24gb.txt" 2>&1
tr '\r' '\n' <"$out/log-fills-24gb.txt" | grep -E '^\| deep|Error|skipped' | cut -c1-240
