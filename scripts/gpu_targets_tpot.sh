#!/usr/bin/env bash
# One device call (fourteenth session): DeepSeek-V2-Lite's 24 GB cells in the plain tpot
# experiment (no routing recorder stages), specter, lru and spec-lru in one process, 3
# HumanEval prompts x 64 tokens; then lru alone again, to bracket the baseline's spread
# across processes (the routing run's lru took 29 ms, gpu_lru_ab.sh's 18 ms).
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_targets_tpot.sh
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
run() {
    local systems=$1 tag=$2 minutes=$3
    timeout 250 python3 -m specter_bench bench --experiment tpot --num-prompts 3 \
        --tag "$tag" --max-minutes "$minutes" --model deepseek-v2-lite --systems "$systems" \
        --budgets 24 --max-new-tokens 64 --out "$out" >"$out/log-$tag.txt" 2>&1
    tr '\r' '\n' <"$out/log-$tag.txt" | grep -E '^\| deep|Error|skipped' | cut -c1-200
}
run specter,lru,spec-lru targets-tpot-24gb 3.6
run lru lru-again-24gb 1.4
