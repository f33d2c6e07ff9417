#!/usr/bin/env bash
# One device call (thirty-seventh session), at the session's code: DeepSeek-V2-Lite's 24 GB
# TPOT cells without the routing experiment (specter, lru, spec-lru; the default auto hot set
# and pruned draft), then Qwen1.5-MoE at its low budget, 14 GB, specter with --draft-pruned 0
# and with the default auto (with lru in that process), 3 HumanEval prompts x 64 tokens, one
# process each.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_cells_37.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
tpot_cells 265 24 specter,lru,spec-lru cells37-24gb 4.1
echo "== DeepSeek 24 GB at $(($(date +%s) - begin)) s"
memory_records "$out/bench-deepseek-v2-lite-cells37-24gb.jsonl"
model_cells qwen1.5-moe 135 14 specter "pruned37-qwen-0-14gb" 2.1 --draft-pruned 0
echo "== Qwen 14 GB pruned 0 at $(($(date +%s) - begin)) s"
model_cells qwen1.5-moe 150 14 specter,lru "pruned37-qwen-auto-14gb" 2.3
echo "== Qwen 14 GB pruned auto at $(($(date +%s) - begin)) s"
hot_set_records "$out"/bench-*37*.jsonl
