#!/usr/bin/env bash
# One device call after the adaptive depth's probe back-off: DeepSeek-V2-Lite at 24 GB
# (lru, specter) and unlimited (hf, lru, specter), 3 HumanEval prompts x 64 tokens, one
# process per budget:
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_backoff.sh
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
tpot_cells 200 unlimited hf,lru,specter backoff-unlimited 2.6
tpot_cells 200 24 lru,specter backoff-24gb 2.6
