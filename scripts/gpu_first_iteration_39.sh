#!/usr/bin/env bash
# One device call (thirty-ninth session): where the first decode iteration's 80-110 ms go at
# 24 GB (later iterations: 11-13 ms of drafting 3-4 proposals). `specter generate` on
# DeepSeek-V2-Lite at 24 GB with the cells37 bench file's hot set, HumanEval/1, 64 tokens,
# --depth 3, each iteration traced with its host time per method: as it is, then with the
# device synchronised after the prefill (work the prefill left queued shows as its wait).
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_first_iteration_39.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
humaneval_prompt 1
results=benchmarks/results/bench-deepseek-v2-lite-2026-12-04-cells37-24gb.jsonl
iteration_trace 24gb-k3 100 --gpu-memory-gb 24 --hot-experts "$results" --depth 3
echo "  at $(($(date +%s) - begin)) s"
iteration_trace 24gb-k3-sync 100 --sync-prefill --gpu-memory-gb 24 --hot-experts "$results" --depth 3
echo "  at $(($(date +%s) - begin)) s"
