#!/usr/bin/env bash
# One device call (under 10 minutes) that validates what was written without a GPU and
# measures it, on the GPU machine from the repository root:
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_validate.sh
#
# 1. the CUDA tests (models' test_cuda.py, kernels' rotary GPU tests, the cache's
#    CUDA tests)                                                     -> $OUT/gpu-tests.txt
# 2. step times of DeepSeek-V2-Lite with every fusion and with each one off (no budget
#    part)                                                           -> $OUT/step-graphs.jsonl
# 3. DeepSeek-V2-Lite at 24 GB: specter, specter-row-cut and lru side by side
#                                                                    -> $OUT/bench-*.jsonl
# Each part has its own time limit, so a failing or slow part leaves the others their time.
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"

timeout 150 python3 -m pytest -q packages/specter-models/tests/test_cuda.py \
    packages/specter-cache/tests/test_expert_cache_cuda.py 2>&1 | tail -25 >"$out/gpu-tests.txt"
timeout 60 python3 -m pytest -q packages/specter-kernels/tests/test_gpu.py -k rotary \
    2>&1 | tail -5 >>"$out/gpu-tests.txt"
tail -3 "$out/gpu-tests.txt"

timeout 150 python3 scripts/gpu_step_graphs.py --model deepseek-v2-lite --skip budget \
    --out "$out/step-graphs.jsonl" 2>&1 | grep -v '^{' | tail -5

timeout 200 python3 -m specter_bench bench --model deepseek-v2-lite --experiment default \
    --systems specter,specter-row-cut,lru --budgets 24 --num-prompts 2 --max-new-tokens 64 \
    --out "$out" --tag gpu --max-minutes 3.0 2>&1 | tr '\r' '\n' | grep '^| ' | head -12
