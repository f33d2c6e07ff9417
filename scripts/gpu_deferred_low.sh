#!/usr/bin/env bash
# One device call (twenty-seventh session): the low budgets with the deferred counts:
# DeepSeek-V2-Lite at 16 GB and Qwen1.5-MoE at 14 GB, specter and lru in one process each,
# 3 HumanEval prompts x 64 tokens.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_deferred_low.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
tpot_cells 150 16 specter,lru deferred-16gb 2.1
echo "DeepSeek 16 GB done at $(($(date +%s) - begin)) s"
model_cells qwen1.5-moe 150 14 specter,lru deferred-qwen-14gb 2.1
echo "done at $(($(date +%s) - begin)) s"
