#!/usr/bin/env bash
# One device call: the CUDA tests of streamed fills (kernels, cache, models), then the 24 GB
# target cells of DeepSeek-V2-Lite (lru, spec-lru, specter, specter-fill, the Belady bound,
# routing and one hot count) on 3 HumanEval prompts x 64 tokens, in one process:
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_fills_targets.sh
# The unlimited cells are gpu_fills_unlimited.sh (another process: the targets compare
# systems within a budget).
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
cuda_tests() {
    timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE --tb=short "$@" 2>&1 \
        | grep -vE "^\s*$" | tail -12 | tee -a "$out/gpu-tests-fills-final.txt"
}
cuda_tests packages/specter-kernels/tests/test_gpu.py -k "fills or streamed"
cuda_tests packages/specter-cache/tests/test_expert_cache_cuda.py
cuda_tests packages/specter-models/tests/test_cuda.py -k "streamed or budget or hot"
SPECTER_BENCH_MINUTES="${BENCH_MINUTES:-5.6}" timeout 420 bash scripts/gpu_bench.sh \
    deepseek-v2-lite --experiment default --systems lru,spec-lru,specter,specter-fill \
    --budgets 24 --num-prompts 3 --max-new-tokens 64 --depths 4 --hot-counts 24 \
    >/dev/null 2>&1
tr '\r' '\n' <"$out/log-deepseek-v2-lite.txt" | grep -E '^\| deep|Error|skipped' \
    | cut -c1-240 | head -30
