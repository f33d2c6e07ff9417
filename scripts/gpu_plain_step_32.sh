#!/usr/bin/env bash
# One device call (thirty-second session): where a streamed plain decode step's time goes,
# with the prompt's prefill subtracted (scripts/plain_step_probe.py: a profiled decode of 17
# tokens minus one of 1): Qwen1.5-MoE at 14 GB and with every expert resident, then
# DeepSeek-V2-Lite at 24 GB; pipelined records, fills, one process each.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_plain_step_32.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
for cell in "qwen1.5-moe 14" "qwen1.5-moe 0" "deepseek-v2-lite 24"; do
    read -r model budget <<<"$cell"
    timeout 110 python3 scripts/plain_step_probe.py --model "$model" --budget-gb "$budget" \
        --out "$out/plain-step.jsonl" >"$out/log-probe.txt" 2>&1
    echo "== $model $budget GB (rc $?) at $(($(date +%s) - begin)) s"
    tail -n 1 "$out/plain-step.jsonl" | python3 -c "import json,sys; \
d=json.loads(sys.stdin.read()); print({k: d[k] for k in ('model','budget_gb','tpot_ms',\
'hit_rate','profiled_wall_ms_per_token','kernel_busy_ms_per_token','copy_busy_ms_per_token',\
'kernels_per_token')}); print(d['top_kernels_ms_per_token']); print(d['copies_ms_per_token']); \
print(d['runtime_ms_per_token']); print(d['runtime_calls_per_token'])"
done
echo "done at $(($(date +%s) - begin)) s"
