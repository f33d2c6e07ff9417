#!/usr/bin/env bash
# One device call (thirty-fourth session): the routing of 24 HumanEval sequences for offline
# policy studies (scripts/routing_trace_probe.py: target and INT4 draft, prompt and 64
# generated tokens each), then the targets' cells at the session's code as gpu_cells_32.sh
# (24 GB specter, lru, spec-lru with the routing experiment; unlimited hf and specter).
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_routing_cells_34.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
timeout 240 python3 scripts/routing_trace_probe.py --num-prompts 24 --out "$out/routing34.pt" \
    >"$out/log-routing34.txt" 2>&1
tail -4 "$out/log-routing34.txt"
echo "routing done at $(($(date +%s) - begin)) s"
tpot_cells 330 24 specter,lru,spec-lru cells34-24gb 5.0 --experiment routing
echo "24 GB done at $(($(date +%s) - begin)) s"
tpot_cells 160 unlimited hf,specter cells34-unlimited 2.3
memory_records "$out/bench-deepseek-v2-lite-cells34-24gb.jsonl"
echo "done at $(($(date +%s) - begin)) s"
