#!/usr/bin/env bash
# One device call (twenty-fifth session): the cells no earlier call reached at the current
# code. Phi-3.5-MoE at 32 GB, its low budget (lru, specter; 1 HumanEval prompt x 32 tokens),
# and DeepSeek-V2-Lite's 24 GB routing run (specter, lru; 3 prompts x 64 tokens), which
# records the target's routing and so the Belady bound, last measured at 79a3a08.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_gaps.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
model_cells phi-3.5-moe 270 32 lru,specter phi-gaps-32gb 4.2 --num-prompts 1 --max-new-tokens 32
echo "Phi 32 GB done at $(($(date +%s) - begin)) s"
tpot_cells 260 24 specter,lru routing-gaps-24gb 4.0 --experiment routing
echo "done at $(($(date +%s) - begin)) s"
