#!/usr/bin/env bash
# One device call (thirty-ninth session): the first decode iteration's draft at 24 GB spent
# 45-76 ms of host time inside SpeculativePrefetcher.on_draft_token outside every nested call
# the first trace timed. The same run with the counter's snapshot, its result, the copy
# engine's markers and the planner's checks timed too, then with one snapshot taken and read
# after the graphs' capture (--warm-snapshot).
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_first_iteration_39b.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
humaneval_prompt 1
results=benchmarks/results/bench-deepseek-v2-lite-2026-12-04-cells37-24gb.jsonl
iteration_trace 24gb-k3 100 --gpu-memory-gb 24 --hot-experts "$results" --depth 3
echo "  at $(($(date +%s) - begin)) s"
iteration_trace 24gb-k3-warm 100 --warm-snapshot --gpu-memory-gb 24 --hot-experts "$results" --depth 3
grep "warm snapshot" "$out/iterations.err"
echo "  at $(($(date +%s) - begin)) s"
