#!/usr/bin/env bash
# One device call (sixteenth session): Qwen1.5-MoE at 20 GB (specter, lru, spec-lru) and
# unlimited (hf, lru, specter) with the one-launch invariant GEMM and PDL's wait mode, one
# process each, 3 HumanEval prompts x 64 tokens.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_qwen_one_launch.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
model_cells qwen1.5-moe 165 20 specter,lru,spec-lru qwen-one-launch-20gb 2.4
model_cells qwen1.5-moe 165 unlimited hf,lru,specter qwen-one-launch-unlimited 2.4
