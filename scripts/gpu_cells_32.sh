#!/usr/bin/env bash
# One device call (thirty-second session): the targets' cells at the session's code.
# DeepSeek-V2-Lite at 24 GB with `specter`, `lru` and `spec-lru` in one process with the
# routing experiment (the Belady bound, policy hit rates, agreement), then unlimited with
# `hf` (fastest configuration) and `specter`, one process; 3 HumanEval prompts x 64 tokens.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_cells_32.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
tpot_cells 330 24 specter,lru,spec-lru cells32-24gb 5.0 --experiment routing
echo "24 GB done at $(($(date +%s) - begin)) s"
tpot_cells 160 unlimited hf,specter cells32-unlimited 2.3
echo "done at $(($(date +%s) - begin)) s"
