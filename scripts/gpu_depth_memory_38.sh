#!/usr/bin/env bash
# One device call (thirty-eighth session): `specter generate` at 24 GB with the cells37 bench
# file's hot set and pruned experts on HumanEval/1, 64 tokens, --depth auto, one process each
# on one fresh depth-costs folder: the first run of the setup (nothing kept yet), then runs
# primed with the costs the runs before kept, and one with --no-depth-memory between them.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_depth_memory_38.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
SPECTER_CACHE_DIR=$(mktemp -d)
export SPECTER_CACHE_DIR
python3 -c "from specter_bench.prompt_sources import load_humaneval; \
print(load_humaneval(2)[1].text, end='')" >"$out/prompt.txt"
results=benchmarks/results/bench-deepseek-v2-lite-2026-12-04-cells37-24gb.jsonl
for arm in first primed off primed2; do
    case $arm in off) extra=(--no-depth-memory) ;; *) extra=() ;; esac
    generate_record "24gb-memory-$arm" 110 --gpu-memory-gb 24 --hot-experts "$results" "${extra[@]}"
    echo "  at $(($(date +%s) - begin)) s"
done
generate_lines depth_costs
cp "$SPECTER_CACHE_DIR"/depth-costs/*.json "$out/" 2>/dev/null
