#!/usr/bin/env bash
# One device call (seventeenth session): is `lru`'s slow mode at 24 GB host pauses, and did
# the sixteenth session slow Qwen1.5-MoE's 20 GB `specter`? In order:
#   1. DeepSeek-V2-Lite 24 GB `lru` alone, in a fresh process;
#   2. 24 GB `specter` then `lru` in one process (the targets' order);
#      each record's extra.host_pauses has the garbage collections and allocator calls;
#   3. Qwen1.5-MoE 20 GB `specter` at the fifteenth session's tree (9e646ae, unpacked under
#      .ab/q by `git archive 9e646ae packages scripts | tar -x -C .ab/q`), then at this tree;
#      2 HumanEval prompts x 64 tokens each, one process each.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_lru_pauses.sh   (carry .ab and .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
new_path="$PYTHONPATH"
q_path="${PYTHONPATH//$PWD\/packages/$PWD/.ab/q/packages}"
tpot_cells 100 24 lru pauses-24gb-lru 1.4
tpot_cells 150 24 specter,lru pauses-24gb 2.2
PYTHONPATH="$q_path" model_cells qwen1.5-moe 110 20 specter qwen20-ab-old 1.5 --num-prompts 2
PYTHONPATH="$new_path" model_cells qwen1.5-moe 110 20 specter qwen20-ab-new 1.5 --num-prompts 2
