#!/usr/bin/env bash
# One device call (under 10 minutes) for the streamed miss path: the models' streamed CUDA
# tests, then the issue's target cells with `specter` (streaming) beside `specter-acquire`
# (the acquire path it replaces), `lru`, `spec-lru` and `hf`, in one process:
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_stream_targets.sh
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
timeout 60 python3 -m pytest -q -p no:cacheprovider packages/specter-models/tests/test_cuda.py \
    -k "streamed" -rfE --tb=short 2>&1 | tail -2 | tee "$out/gpu-tests-models-streamed.txt"
SPECTER_BENCH_MINUTES="${BENCH_MINUTES:-6.6}" timeout 500 bash scripts/gpu_bench.sh \
    deepseek-v2-lite --experiment default --systems hf,lru,spec-lru,specter,specter-acquire \
    --budgets 24,unlimited --num-prompts 2 --max-new-tokens 64 --depths 4 --hot-counts 32 \
    >/dev/null 2>&1
tr '\r' '\n' <"$out/log-deepseek-v2-lite.txt" | grep -E '^\| deep|Error|skipped|captured' \
    | cut -c1-260 | head -30
