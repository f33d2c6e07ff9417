#!/usr/bin/env bash
# One device call (twenty-fifth session): the targets' cells at the session's final code (the
# routed pair sum in the residual join): DeepSeek-V2-Lite unlimited (hf, lru, specter) and
# 24 GB (specter, lru, spec-lru), 3 HumanEval prompts x 64 tokens, one process each.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_pair_join_cells.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
tpot_cells 170 unlimited hf,lru,specter final-unlimited 2.6
echo "unlimited done at $(($(date +%s) - begin)) s"
tpot_cells 170 24 specter,lru,spec-lru final-24gb 2.4
echo "done at $(($(date +%s) - begin)) s"
