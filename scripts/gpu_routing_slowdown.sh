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
tpot_cells 240 24 lru slowdown-after-routing 3.6 --experiment routing
tpot_cells 150 24 lru slowdown-tpot-last 2.0
