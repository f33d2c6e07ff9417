#!/usr/bin/env bash
# One device call (fifteenth session): Phi-3.5-MoE at the current code, its low and high
# budgets and unlimited, one process each, 1 HumanEval prompt x 32 tokens (at 1 and 3
# FP16 slots of 16 per layer a token moves about 8 GB, so about 0.15 s):
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_phi_current.sh
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
phi() {
    model_cells phi-3.5-moe "$@" --num-prompts 1 --max-new-tokens 32
}
phi 190 32 specter,lru,spec-lru phi-current-32gb 3.0
phi 190 40 specter,lru,spec-lru phi-current-40gb 3.0
phi 190 unlimited hf,lru,specter phi-current-unlimited 3.0
