#!/usr/bin/env bash
# One device call for staged streaming (thirteenth session, prepared on the CPU, not yet
# run): the CUDA tests it touches (specter-kernels' staged and streamed tests, specter-cache's,
# specter-models' streamed, budget, hot and staged tests), the streamed-GEMM probe with its
# staged mode beside the fused one (two tile swaps of each kind), then the A/B of staging at a
# fixed depth K = 6: DeepSeek-V2-Lite at 24 GB in one process, specter and specter-staged
# (8 staged experts, a load of its own) on 3 HumanEval prompts x 64 tokens. The targets'
# cells, at the adaptive depth, with specter-staged beside them are the next call,
# gpu_staging_targets.sh.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_staging.sh
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
cuda_tests_to gpu-tests-staging.txt packages/specter-kernels/tests/test_gpu.py -k "stream or staged"
cuda_tests_to gpu-tests-staging.txt packages/specter-cache/tests/test_expert_cache_cuda.py
cuda_tests_to gpu-tests-staging.txt packages/specter-models/tests/test_cuda.py \
    -k "streamed or budget or hot or staged"
timeout 180 python3 scripts/streamed_gemm_probe.py --out "$out/streamed-gemm-probe.jsonl" \
    --configs 64x128/4,32x256/3 --per-pair-configs 32/4/4,16/4/4 \
    2>&1 | grep -vE "Warning|warn" | cut -c1-220
timeout 250 python3 -m specter_bench bench --experiment tpot --num-prompts 3 --depth 6 \
    --tag staging-ab-24gb --max-minutes 3.7 --model deepseek-v2-lite \
    --systems specter,specter-staged --budgets 24 --max-new-tokens 64 \
    --out "$out" >"$out/log-staging-ab-24gb.txt" 2>&1
tr '\r' '\n' <"$out/log-staging-ab-24gb.txt" | grep -E '^\| deep|Error|skipped|staging' \
    | cut -c1-240 | head -30
