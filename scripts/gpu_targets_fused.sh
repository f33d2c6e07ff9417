#!/usr/bin/env bash
# One device call (under 10 minutes) at the eighth session's code: the new kernels' CUDA
# tests, then the issue's target cells on DeepSeek-V2-Lite (the default experiment: hf,
# lru, spec-lru, specter at 24 GB and unlimited with the Belady bound, 2 HumanEval prompts
# x 64 tokens):
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_targets_fused.sh
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
timeout 60 python3 -m pytest -q -p no:cacheprovider packages/specter-kernels/tests/test_gpu.py \
    -k "router or mla or silu" 2>&1 | tail -2 | tee "$out/gpu-tests-new-kernels.txt"
SPECTER_BENCH_MINUTES="${BENCH_MINUTES:-7.2}" timeout 520 bash scripts/gpu_bench.sh \
    deepseek-v2-lite --experiment default --systems hf,lru,spec-lru,specter \
    --budgets 24,unlimited --num-prompts 2 --max-new-tokens 64 --depths 4 --hot-counts 32 \
    >/dev/null 2>&1
tr '\r' '\n' <"$out/log-deepseek-v2-lite.txt" | grep -E '^\| deep|Error|skipped' | head -24
