#!/usr/bin/env bash
# One device call (under 10 minutes) for the pinned hot set, on the GPU machine from the
# repository root:
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_hot.sh
#
# 1. the CUDA tests of the hot set: kernels' skipped pairs (and the fused W4A16 kernel),
#    models' hot-set draft graphs and exact speculation          -> $OUT/gpu-tests.txt
# 2. DeepSeek-V2-Lite at 24 GB: specter (with its chosen hot set), specter-no-hot, spec-lru
#    and lru side by side, the routing experiments (Belady bound), one fixed depth, and the
#    hot-count sweep                                              -> $OUT/bench-*.jsonl
# Extra arguments go to `specter bench`.
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"

timeout 90 python3 -m pytest -q packages/specter-kernels/tests/test_gpu.py -k "w4a16" 2>&1 \
    | tail -4 >"$out/gpu-tests.txt"
timeout 120 python3 -m pytest -q packages/specter-models/tests/test_cuda.py \
    -k "hot or speculation_is_exact or draft_step" 2>&1 | tail -8 >>"$out/gpu-tests.txt"
cat "$out/gpu-tests.txt"

timeout "${SPECTER_BENCH_SECONDS:-470}" python3 -m specter_bench bench --model deepseek-v2-lite \
    --experiment default --systems specter,specter-no-hot,spec-lru,lru --budgets 24 \
    --num-prompts 2 --max-new-tokens 64 --depths 4 --out "$out" --tag hot \
    --max-minutes "${SPECTER_BENCH_MINUTES:-7.0}" "$@" 2>&1 | tr '\r' '\n' \
    | grep -v '^deepseek-v2-lite:' >"$out/log-hot.txt"
grep -E '^\| |hot set|skipped|Error' "$out/log-hot.txt" | head -40
