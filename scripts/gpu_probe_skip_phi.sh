#!/usr/bin/env bash
# One device call (twenty-fourth session): Phi-3.5-MoE (1 HumanEval prompt x 32 tokens) at
# 40 GB (lru, specter; the cell the twenty-third session's call cut) and unlimited (lru,
# specter), the probe skip at the defaults, one process each.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_probe_skip_phi.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
phi() {
    model_cells phi-3.5-moe "$@" --num-prompts 1 --max-new-tokens 32
}
phi 300 40 lru,specter phi-skip-40gb 4.5
echo "40 GB done at $(($(date +%s) - begin)) s"
phi 200 unlimited lru,specter phi-skip-unlimited 3
echo "done at $(($(date +%s) - begin)) s"
