#!/usr/bin/env bash
# One device call (fourteenth session): DeepSeek-V2-Lite's 24 GB cells in the plain tpot
# experiment (no routing recorder stages), specter, lru and spec-lru in one process, 3
# HumanEval prompts x 64 tokens; then lru alone again, to bracket the baseline's spread
# across processes (the routing run's lru took 29 ms, gpu_lru_ab.sh's 18 ms).
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_targets_tpot.sh
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
tpot_cells 250 24 specter,lru,spec-lru targets-tpot-24gb 3.6
tpot_cells 250 24 lru lru-again-24gb 1.4
