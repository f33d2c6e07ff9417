#!/usr/bin/env bash
# One device call (seventeenth session): the targets at this session's final code, plain
# steps queued ahead and the adaptive depth pricing them at their steady state. In order:
#   1. DeepSeek-V2-Lite unlimited: hf, lru, specter;
#   2. DeepSeek-V2-Lite 24 GB: specter, lru, spec-lru;
#   3. Qwen1.5-MoE unlimited: lru, specter (where the adaptive depth had kept speculating).
# Each cell: 3 HumanEval prompts x 64 tokens, greedy, one process.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_queued_final.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
tpot_cells 140 unlimited hf,lru,specter final-unlimited 2.0
tpot_cells 140 24 specter,lru,spec-lru final-24gb 2.0
model_cells qwen1.5-moe 100 unlimited lru,specter final-qwen-unlimited 1.4
