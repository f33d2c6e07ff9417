#!/usr/bin/env bash
# One device call after gpu_fills.sh: the models' streamed CUDA test with its tracebacks,
# then Qwen1.5-MoE at 14 GB (routing that repeats: where fills should pay) with `lru`,
# `specter`, `specter-no-fill` and `specter-acquire` in one process:
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_fills_more.sh
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
timeout 150 python3 -m pytest -q -p no:cacheprovider -rfE --tb=short \
    packages/specter-models/tests/test_cuda.py -k streamed 2>&1 | grep -vE "^\s*$" \
    | tail -60 | tee "$out/gpu-tests-fills-models.txt"
timeout "${BENCH_TIMEOUT:-300}" python3 -m specter_bench bench --experiment tpot \
    --num-prompts 2 --tag fills-14gb --max-minutes "${BENCH_MINUTES:-4}" \
    --model qwen1.5-moe --systems lru,specter,specter-no-fill,specter-acquire --budgets 14 \
    --max-new-tokens 64 --out "$out" >"$out/log-qwen-fills-14gb.txt" 2>&1
tr '\r' '\n' <"$out/log-qwen-fills-14gb.txt" | grep -E '^\| qwen|Error|skipped' | cut -c1-240
