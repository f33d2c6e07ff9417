#!/usr/bin/env bash
# One device call (twenty-sixth session): Qwen1.5-MoE at its low budget, 14 GB, with specter
# and lru in one process (the twenty-fourth session's call cut lru by time), 3 HumanEval
# prompts x 64 tokens.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_qwen_14gb.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
model_cells qwen1.5-moe 185 14 specter,lru qwen-14gb 2.9
echo "done at $(($(date +%s) - begin)) s"
