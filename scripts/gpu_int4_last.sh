#!/usr/bin/env bash
# One device call (twenty-first session, the last): Phi-3.5-MoE's specter alone at unlimited
# with the new W4A16 gemv defaults (gpu_phi_int4.sh's full cell ran out of time after hf; its
# legacy arm gave 11.04 ms), then DeepSeek-V2-Lite's 24 GB cell (specter, lru, one process).
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_int4_last.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
model_cells phi-3.5-moe 170 unlimited specter phi-new-unlimited 2.5 --num-prompts 1 \
    --max-new-tokens 32
echo "phi done at $(($(date +%s) - begin)) s"
tpot_cells 210 24 specter,lru int4-24gb 2.9
echo "done at $(($(date +%s) - begin)) s"
