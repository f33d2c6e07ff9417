#!/usr/bin/env bash
# One device call (fourteenth session) after the adaptive depth's measured per-depth costs:
# DeepSeek-V2-Lite's 24 GB cells (specter, lru, spec-lru) in one process, then the unlimited
# ones (hf, lru, specter) in another, 3 HumanEval prompts x 64 tokens each:
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_depth_targets.sh
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
tpot_cells 170 24 specter,lru,spec-lru depth-24gb 2.6
tpot_cells 170 unlimited hf,lru,specter depth-unlimited 2.2
