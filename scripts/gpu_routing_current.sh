#!/usr/bin/env bash
# One device call (fifteenth session): DeepSeek-V2-Lite's 24 GB routing run at the current
# code (the Belady bound beside specter, lru and spec-lru, 3 HumanEval prompts x 64 tokens,
# one process), then Phi-3.5-MoE's lru at 40 GB (1 prompt x 32 tokens), which the
# gpu_phi_current.sh call's time cut left out:
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_routing_current.sh
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
tpot_cells 380 24 specter,lru,spec-lru routing-current-24gb 6.1 --experiment routing
model_cells phi-3.5-moe 170 40 lru phi-current-lru-40gb 2.6 --num-prompts 1 \
    --max-new-tokens 32
