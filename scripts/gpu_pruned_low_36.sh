#!/usr/bin/env bash
# One device call (thirty-sixth session): the pruned draft beyond DeepSeek-V2-Lite 24 GB:
# Qwen1.5-MoE at 20 GB, specter with --draft-pruned 0 then auto (one process each), and
# DeepSeek-V2-Lite at its low budget, 16 GB (specter with auto, lru), 3 HumanEval prompts x
# 64 tokens.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_pruned_low_36.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
for count in 0 auto; do
    model_cells qwen1.5-moe 150 20 specter "pruned36-qwen-$count-20gb" 2.3 --draft-pruned "$count"
    echo "== Qwen 20 GB pruned $count at $(($(date +%s) - begin)) s"
done
tpot_cells 240 16 specter,lru pruned36-16gb 3.8
echo "== DeepSeek 16 GB at $(($(date +%s) - begin)) s"
memory_records "$out/bench-deepseek-v2-lite-pruned36-16gb.jsonl"
hot_set_records "$out"/bench-*pruned36*.jsonl
