#!/usr/bin/env bash
# One device call after the batched prefetch (specter-cache): the cache's and the models'
# budget CUDA tests, the draft-loop probe at 24 GB (the prefetcher's host time per draft
# token, against draft-loop-probe-2026-12-01.jsonl before the change), then DeepSeek-V2-Lite's
# 24 GB target cells (lru, spec-lru, specter, the Belady bound) on 3 HumanEval prompts x 64
# tokens, in one process:
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_batched_prefetch.sh
# The unlimited cell is gpu_fills_unlimited.sh (another process).
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
cuda_tests_to gpu-tests-batched-prefetch.txt packages/specter-cache/tests/test_expert_cache_cuda.py
cuda_tests_to gpu-tests-batched-prefetch.txt packages/specter-models/tests/test_cuda.py -k "streamed or budget or hot"
timeout 120 python3 scripts/draft_loop_probe.py --depth 4 --budget-gb 24 \
    --out "$out/draft-loop-probe.jsonl" 2>&1 | grep -vE "Warning|warn" | tail -3
timeout 330 python3 -m specter_bench bench --experiment routing --num-prompts 3 \
    --tag batched-prefetch-24gb --max-minutes 4.6 --model deepseek-v2-lite \
    --systems lru,spec-lru,specter --budgets 24 --max-new-tokens 64 --out "$out" \
    >"$out/log-batched-prefetch-24gb.txt" 2>&1
tr '\r' '\n' <"$out/log-batched-prefetch-24gb.txt" | grep -E '^\| deep|Error|skipped' \
    | cut -c1-240 | head -30
