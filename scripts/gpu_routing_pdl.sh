#!/usr/bin/env bash
# One device call (sixteenth session): DeepSeek-V2-Lite's 24 GB routing run (the Belady bound
# at the current depth policy) with the one-launch invariant GEMM, the fused q/kv_a projection
# and PDL in its default (wait) mode; 3 HumanEval prompts x 64 tokens, one process.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_routing_pdl.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
tpot_cells 360 24 specter,lru,spec-lru routing-pdl-24gb 5.4 --experiment routing
