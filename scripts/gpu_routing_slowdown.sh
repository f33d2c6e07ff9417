#!/usr/bin/env bash
# One device call (prepared in the fifteenth session, not yet run): does a routing stage slow
# the lru stage after it? DeepSeek-V2-Lite at 24 GB, 3 HumanEval prompts x 64 tokens, lru in
# three processes: TPOT-only, after a routing stage (--experiment routing --systems lru runs
# the routing experiments on a draft load with no decode, then the lru stage), TPOT-only
# again. In the fourteenth and fifteenth sessions lru took 27-29 ms per token after routing
# stages and 17-19 ms in TPOT-only processes:
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_routing_slowdown.sh
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
tpot_cells 150 24 lru slowdown-tpot-first 2.0
timeout 240 python3 -m specter_bench bench --experiment routing --num-prompts 3 \
    --tag slowdown-after-routing --max-minutes 3.6 --model deepseek-v2-lite --systems lru \
    --budgets 24 --max-new-tokens 64 --out "$out" >"$out/log-slowdown-after-routing.txt" 2>&1
tr '\r' '\n' <"$out/log-slowdown-after-routing.txt" | grep -E '^\| deep|Error|skipped' \
    | cut -c1-200 | head -8
tpot_cells 150 24 lru slowdown-tpot-last 2.0
