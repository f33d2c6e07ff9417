#!/usr/bin/env bash
# One device call (twenty-seventh session): DeepSeek-V2-Lite at 24 GB, specter and lru in one
# process at the session's final code, one more sample of the 1/2 cell (3 HumanEval x 64).
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_deferred_24gb_again.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
tpot_cells 200 24 specter,lru deferred-24gb-again 2.4
echo "done at $(($(date +%s) - begin)) s"
