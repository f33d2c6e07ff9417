#!/usr/bin/env bash
# One device call (twenty-third session): Phi-3.5-MoE's unlimited cell (hf, lru, specter) and
# its 40 GB cell (specter, lru) at the new defaults, 1 HumanEval prompt x 32 tokens, one
# process each.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_early_phi.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
phi() {
    model_cells phi-3.5-moe "$@" --num-prompts 1 --max-new-tokens 32
}
phi 175 unlimited hf,lru,specter phi-early-unlimited 2.6
echo "unlimited done at $(($(date +%s) - begin)) s"
phi 165 40 specter,lru phi-early-40gb 2.4
echo "done at $(($(date +%s) - begin)) s"
