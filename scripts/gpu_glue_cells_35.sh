#!/usr/bin/env bash
# One device call (thirty-fifth session): DeepSeek-V2-Lite unlimited, plain decoding (the
# unlimited target's cell), this tree against the tree before the argmax kernel and the
# router's selection by place (.ab/old: `git archive c099af3 packages scripts | tar -x -C
# .ab/old`), arms in turn: new (hf, specter), old, new with SPECTER_ROUTER_RANK_SELECT=0
# (the argmax alone), new again. 3 HumanEval prompts x 64 tokens, one process an arm.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_glue_cells_35.sh   (carry .ab and .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
new_path="$PYTHONPATH"
old_path="${PYTHONPATH//$PWD\/packages/$PWD/.ab/old/packages}"
PYTHONPATH="$new_path" tpot_cells 170 unlimited hf,specter glue-new-unlimited 2.5
echo "== at $(($(date +%s) - begin)) s"
PYTHONPATH="$old_path" tpot_cells 110 unlimited specter glue-old-unlimited 1.6
echo "== at $(($(date +%s) - begin)) s"
SPECTER_ROUTER_RANK_SELECT=0 PYTHONPATH="$new_path" tpot_cells 110 unlimited specter \
    glue-rounds-unlimited 1.6
echo "== at $(($(date +%s) - begin)) s"
PYTHONPATH="$new_path" tpot_cells 110 unlimited specter glue-new2-unlimited 1.6
echo "all done at $(($(date +%s) - begin)) s"
