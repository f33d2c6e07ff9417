#!/usr/bin/env bash
# One device call (thirty-seventh session): `specter generate` at 24 GB with a bench results
# file's hot set and pruned experts on HumanEval/1, twice in a row on one fresh machine: the
# first run compiles the Triton kernels its decode is the first to use (a cold cache), the
# second finds them compiled.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_generate_warm_37.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
python3 -c "from specter_bench.prompt_sources import load_humaneval; \
print(load_humaneval(2)[1].text, end='')" >"$out/prompt.txt"
results=benchmarks/results/bench-deepseek-v2-lite-2026-12-04-cells37-24gb.jsonl
for run in first second; do
    generate_record "file-24gb-$run" 110 --gpu-memory-gb 24 --hot-experts "$results"
    echo "  at $(($(date +%s) - begin)) s"
done
