#!/usr/bin/env bash
# One device call (twenty-sixth session): DeepSeek-V2-Lite's specter at 24 GB with more
# pinned hot experts than the calibration replay's candidates reach (every E // 16 = 4th
# count: 36 of 39 slots), one process an arm: 39 pinned (40 slots, 1 evictable), the
# replay's choice (auto: 36 of 39), 38 pinned (40 slots at the bench's max_seq_len, 2
# evictable); 3 HumanEval prompts x 64 tokens.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_hot_top.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
tpot_cells 110 24 specter hot39-24gb 1.6 --hot-experts 39
echo "39 done at $(($(date +%s) - begin)) s"
tpot_cells 110 24 specter hot-auto-24gb 1.6
echo "auto done at $(($(date +%s) - begin)) s"
tpot_cells 110 24 specter hot38-24gb 1.6 --hot-experts 38
echo "done at $(($(date +%s) - begin)) s"
