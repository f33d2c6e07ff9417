#!/usr/bin/env bash
# One device call (twenty-ninth session): `specter generate` on the built-in model at the
# final code (graphs captured for the first 256 positions); then where Qwen1.5-MoE's
# streamed plain step (14 GB, 99% hits, 5.8 ms against 2.4 resident) spends its time:
# scripts/plain_step_probe.py at 14 GB and with every expert resident.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_plain_step.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
timeout 90 python3 -m specter_bench generate --json --no-stream \
    >"$out/generate-default.txt" 2>"$out/generate-default.err"
echo "== generate (rc $?) at $(($(date +%s) - begin)) s"
tail -n 1 "$out/generate-default.txt" | cut -c1-400
grep -E "captured" "$out/generate-default.err"
for budget in 14 0; do
    timeout 150 python3 scripts/plain_step_probe.py --model qwen1.5-moe --budget-gb "$budget" \
        --out "$out/plain-step-qwen.jsonl" >"$out/log-plain-step-$budget.txt" 2>&1
    echo "== probe $budget GB (rc $?) at $(($(date +%s) - begin)) s"
    grep -vE "Warning|_warn_once|^\s*$" "$out/log-plain-step-$budget.txt" | tail -40 | cut -c1-160
done
