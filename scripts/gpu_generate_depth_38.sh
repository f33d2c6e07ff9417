#!/usr/bin/env bash
# One device call (thirty-eighth session): `specter generate` at 24 GB with the cells37 bench
# file's hot set and pruned experts on HumanEval/1, 64 tokens, --depth auto against --depth 2
# (the depth the bench's adaptive depth held on that prompt), alternated, one process each:
# what the adaptive depth's learning costs a one-shot generate under a budget.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_generate_depth_38.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
python3 -c "from specter_bench.prompt_sources import load_humaneval; \
print(load_humaneval(2)[1].text, end='')" >"$out/prompt.txt"
results=benchmarks/results/bench-deepseek-v2-lite-2026-12-04-cells37-24gb.jsonl
for arm in auto fixed2 auto2 fixed2b; do
    case $arm in fixed*) depth=(--depth 2) ;; *) depth=() ;; esac
    generate_record "24gb-$arm" 110 --gpu-memory-gb 24 --hot-experts "$results" "${depth[@]}"
    echo "  at $(($(date +%s) - begin)) s"
done
