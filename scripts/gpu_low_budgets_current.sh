#!/usr/bin/env bash
# One device call (fifteenth session): DeepSeek-V2-Lite at its low budget (16 GB: specter,
# lru, spec-lru, 3 HumanEval prompts x 64 tokens) and Phi-3.5-MoE's lru at 32 GB (1 prompt x
# 32 tokens), which the gpu_phi_current.sh call's time cut left out, at the current code:
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_low_budgets_current.sh
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
tpot_cells 200 16 specter,lru,spec-lru current-16gb 3.0
model_cells phi-3.5-moe 190 32 lru phi-current-lru-32gb 2.8 --num-prompts 1 \
    --max-new-tokens 32
