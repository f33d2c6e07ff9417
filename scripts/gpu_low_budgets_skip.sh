#!/usr/bin/env bash
# One device call (twenty-fourth session): every model at its low budget at the current
# code, specter and lru in one process each: DeepSeek-V2-Lite 16 GB and Qwen1.5-MoE 14 GB
# (3 HumanEval prompts x 64 tokens), Phi-3.5-MoE 32 GB (1 x 32).
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_low_budgets_skip.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
tpot_cells 140 16 specter,lru skip-16gb 2.0
echo "DeepSeek 16 GB done at $(($(date +%s) - begin)) s"
model_cells qwen1.5-moe 110 14 specter,lru qwen-skip-14gb 1.5
echo "Qwen 14 GB done at $(($(date +%s) - begin)) s"
model_cells phi-3.5-moe 200 32 lru,specter phi-skip-32gb 3.0 --num-prompts 1 --max-new-tokens 32
echo "done at $(($(date +%s) - begin)) s"
