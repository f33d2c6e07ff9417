#!/usr/bin/env bash
# One device call (fortieth session), at the session's code (the queries absorbed in the MLA
# prologue by default): DeepSeek-V2-Lite's TPOT cells, 3 HumanEval prompts x 64 tokens, one
# process per budget: 24 GB (specter, lru, spec-lru; the default auto hot set and pruned
# draft) and unlimited (hf in its fastest configuration, lru, specter); then, if the call has
# time left, `specter generate --depth auto` at 24 GB with the cells' hot set, traced.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_cells_40.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
tpot_cells 265 24 specter,lru,spec-lru cells40-24gb 4.1
echo "== 24 GB at $(($(date +%s) - begin)) s"
tpot_cells 200 unlimited hf,lru,specter cells40-unlimited 3.0
echo "== unlimited at $(($(date +%s) - begin)) s"
if (($(date +%s) - begin < 440)); then
    SPECTER_CACHE_DIR=$(mktemp -d)
    export SPECTER_CACHE_DIR
    humaneval_prompt 1
    iteration_trace 24gb-auto-cells40 100 --gpu-memory-gb 24 \
        --hot-experts "$out/bench-deepseek-v2-lite-cells40-24gb.jsonl"
    echo "== generate at $(($(date +%s) - begin)) s"
fi
