#!/usr/bin/env bash
# One device call (thirty-ninth session): why the thirty-eighth session's kept 24 GB costs
# priced drafting 3 and 4 proposals at 44-45 ms (against 3.9 and 6.3 for 1 and 2). `specter
# generate` on DeepSeek-V2-Lite at 24 GB with the cells37 bench file's hot set and pruned
# experts, HumanEval/1, 64 tokens, each iteration traced (scripts/iteration_trace_probe.py):
# --depth auto with no kept costs, then fixed depths 3, 4 and 8; then unlimited --depth auto.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_iteration_trace_39.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
SPECTER_CACHE_DIR=$(mktemp -d)
export SPECTER_CACHE_DIR
humaneval_prompt 1
results=benchmarks/results/bench-deepseek-v2-lite-2026-12-04-cells37-24gb.jsonl
iteration_trace 24gb-auto 120 --gpu-memory-gb 24 --hot-experts "$results" --no-depth-memory
echo "  at $(($(date +%s) - begin)) s"
for depth in 3 4 8; do
    iteration_trace "24gb-k$depth" 100 --gpu-memory-gb 24 --hot-experts "$results" --depth "$depth"
    echo "  at $(($(date +%s) - begin)) s"
done
iteration_trace unlimited-auto 90 --no-depth-memory
echo "  at $(($(date +%s) - begin)) s"
