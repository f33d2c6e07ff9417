#!/usr/bin/env bash
# One device call (fourteenth session): the per-pair tile 32 columns wide. specter-kernels'
# CUDA grouped and streamed tests (bits equal to the resident read, batch-invariant), then
# DeepSeek-V2-Lite's 24 GB target cells (specter, lru, spec-lru, the Belady bound of the
# routing experiment) with specter-staged last, 3 HumanEval prompts x 64 tokens, one process:
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_per_pair_tile.sh
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
cuda_tests_to gpu-tests-per-pair.txt packages/specter-kernels/tests/test_gpu.py \
    -k "grouped or stream or staged"
timeout 510 python3 -m specter_bench bench --experiment routing --num-prompts 3 \
    --tag per-pair-24gb --max-minutes 7.9 --model deepseek-v2-lite \
    --systems specter,lru,spec-lru,specter-staged --budgets 24 --max-new-tokens 64 \
    --out "$out" >"$out/log-per-pair-24gb.txt" 2>&1
tr '\r' '\n' <"$out/log-per-pair-24gb.txt" | grep -E '^\| deep|Error|skipped|staging' \
    | cut -c1-240 | head -30
