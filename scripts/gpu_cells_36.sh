#!/usr/bin/env bash
# One device call (thirty-sixth session): the 24 GB cells at the session's code, where the
# bench's specter prunes a third of the experts from its draft by default (--draft-pruned
# auto): DeepSeek-V2-Lite 24 GB specter, lru, spec-lru with the routing experiment's Belady
# bound, then Qwen1.5-MoE at 20 GB (specter, lru), 3 HumanEval prompts x 64 tokens, one
# process a model.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_cells_36.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
tpot_cells 330 24 specter,lru,spec-lru cells36-24gb 4.9 --experiment routing
echo "== DeepSeek 24 GB at $(($(date +%s) - begin)) s"
memory_records "$out/bench-deepseek-v2-lite-cells36-24gb.jsonl"
model_cells qwen1.5-moe 220 20 specter,lru cells36-qwen-20gb 3.4
echo "== Qwen 20 GB at $(($(date +%s) - begin)) s"
hot_set_records "$out"/bench-*cells36*.jsonl
