#!/usr/bin/env bash
# One device call (thirtieth session): DeepSeek-V2-Lite's 24 GB routing run (specter, lru;
# 3 HumanEval prompts x 64 tokens, one process), which records the target's routing and so
# the Belady bound, at the code with layer-wise final plans.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_belady_30.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
tpot_cells 280 24 specter,lru routing30-24gb 4.2 --experiment routing
echo "done at $(($(date +%s) - begin)) s"
