#!/usr/bin/env bash
# One device call (fifteenth session): Qwen1.5-MoE at the current code (the 32-column
# per-pair tile and the adaptive depth's per-depth costs), its low and high budgets and
# unlimited, one process each, 3 HumanEval prompts x 64 tokens:
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_qwen_current.sh
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
model_cells qwen1.5-moe 170 14 specter,lru,spec-lru qwen-current-14gb 2.6
model_cells qwen1.5-moe 170 20 specter,lru,spec-lru qwen-current-20gb 2.6
model_cells qwen1.5-moe 170 unlimited hf,lru,specter qwen-current-unlimited 2.6
