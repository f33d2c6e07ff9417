#!/usr/bin/env bash
# One device call (twenty-fourth session): DeepSeek-V2-Lite at 16 GB and Qwen1.5-MoE at 14 GB
# (their low budgets; 3 HumanEval prompts x 64 tokens) at the current code, specter and lru
# in one process each. (Phi-3.5-MoE's 32 GB did not fit the session's device time.)
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_low_budgets_skip.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
tpot_cells 140 16 specter,lru skip-16gb 2.0
echo "DeepSeek 16 GB done at $(($(date +%s) - begin)) s"
model_cells qwen1.5-moe 110 14 specter,lru qwen-skip-14gb 1.5
echo "done at $(($(date +%s) - begin)) s"
