#!/usr/bin/env bash
# One device call (under 10 minutes) after the unaligned budget waves: the grouped
# kernels' and the budgeted models' CUDA tests, then the issue's target cells
# (gpu_targets_fused.sh's benchmark, shorter):
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_pair_waves.sh
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
timeout 60 python3 -m pytest -q -p no:cacheprovider packages/specter-kernels/tests/test_gpu.py \
    -k "grouped or sum_routed" 2>&1 | tail -2 | tee "$out/gpu-tests-grouped.txt"
timeout 90 python3 -m pytest -q -p no:cacheprovider packages/specter-models/tests/test_cuda.py \
    -k "budget or hot" -rfE --tb=short 2>&1 | tee "$out/gpu-tests-models-budget-full.txt" | tail -2 \
    | tee "$out/gpu-tests-models-budget.txt"
SPECTER_BENCH_MINUTES="${BENCH_MINUTES:-5.2}" timeout 420 bash scripts/gpu_bench.sh \
    deepseek-v2-lite --experiment default --systems hf,lru,spec-lru,specter \
    --budgets 24,unlimited --num-prompts 2 --max-new-tokens 64 --depths 4 --hot-counts 32 \
    >/dev/null 2>&1
tr '\r' '\n' <"$out/log-deepseek-v2-lite.txt" | grep -E '^\| deep|Error|skipped' | head -24
