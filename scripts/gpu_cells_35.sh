#!/usr/bin/env bash
# One device call (thirty-fifth session): the targets' cells at the session's final code:
# DeepSeek-V2-Lite unlimited (hf, lru, specter) and 24 GB (specter, lru, spec-lru, with the
# routing experiment's Belady bound), 3 HumanEval prompts x 64 tokens, one process a budget.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_cells_35.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
tpot_cells 175 unlimited hf,lru,specter cells35-unlimited 2.5
echo "== unlimited at $(($(date +%s) - begin)) s"
tpot_cells 340 24 specter,lru,spec-lru cells35-24gb 5.0 --experiment routing
echo "== 24 GB at $(($(date +%s) - begin)) s"
memory_records "$out/bench-deepseek-v2-lite-cells35-24gb.jsonl"
