#!/usr/bin/env bash
# One device call (twenty-seventh session): the targets' cells with the deferred counts:
# DeepSeek-V2-Lite 24 GB (specter, lru, spec-lru) and unlimited (hf, lru, specter),
# 3 HumanEval prompts x 64 tokens, one process each.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_deferred_cells.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
tpot_cells 170 24 specter,lru,spec-lru deferred-24gb 2.4
echo "24 GB done at $(($(date +%s) - begin)) s"
tpot_cells 170 unlimited hf,lru,specter deferred-unlimited 2.6
echo "done at $(($(date +%s) - begin)) s"
