#!/usr/bin/env bash
# One device call (twenty-fifth session): the routed pair sum in the residual join alone
# (SPECTER_FUSED_PAIR_JOIN), with silu_and_mul in the down GEMV switched off (it measured
# slower at 744d95b: every GEMV program recomputes the whole activation). DeepSeek-V2-Lite's
# resident steps in the order off, on, off (one process an arm), then the unlimited cell
# (hf, lru, specter) with the pair join on. (SPECTER_SILU_MUL_GEMV is ignored since the silu
# GEMV was removed; without it every later tree runs the same arms.)
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_pair_join_ab.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
export SPECTER_SILU_MUL_GEMV=0
resident_steps_ab SPECTER_FUSED_PAIR_JOIN pair 64
echo "steps done at $(($(date +%s) - begin)) s"
tpot_cells 170 unlimited hf,lru,specter pair-unlimited 2.6
echo "done at $(($(date +%s) - begin)) s"
