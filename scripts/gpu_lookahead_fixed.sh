#!/usr/bin/env bash
# One device call (twenty-sixth session): the draft lookahead at fixed depths, with the
# adaptive depth out of the way (it chose K ~ 0 with the lookahead on at a91ae32):
# DeepSeek-V2-Lite at 24 GB, specter and specter-no-lookahead at K = 3 and at K = 1, one
# process a depth, 3 HumanEval prompts x 64 tokens.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_lookahead_fixed.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
tpot_cells 170 24 specter,specter-no-lookahead lookahead-k3-24gb 2.6 --depth 3
echo "K = 3 done at $(($(date +%s) - begin)) s"
tpot_cells 170 24 specter,specter-no-lookahead lookahead-k1-24gb 2.6 --depth 1
echo "done at $(($(date +%s) - begin)) s"
