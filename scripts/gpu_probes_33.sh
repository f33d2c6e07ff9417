#!/usr/bin/env bash
# One device call (thirty-third session): where DeepSeek-V2-Lite's all-resident plain decode
# step spends its time (scripts/plain_step_probe.py at --budget-gb 0, prefill subtracted; the
# unlimited target's cell is plain decoding), then the prepared streamed-tiles probe
# (scripts/gpu_streamed_tiles_33.sh: wider K steps for experts read in place).
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_probes_33.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
timeout 120 python3 scripts/plain_step_probe.py --model deepseek-v2-lite --budget-gb 0 \
    --top 30 --out "$out/plain-step-unlimited.jsonl" >"$out/log-probe.txt" 2>&1
echo "== deepseek-v2-lite unlimited (rc $?) at $(($(date +%s) - begin)) s"
tail -n 1 "$out/plain-step-unlimited.jsonl" | python3 -c "import json,sys; \
d=json.loads(sys.stdin.read()); print({k: d[k] for k in ('model','budget_gb','tpot_ms',\
'profiled_wall_ms_per_token','kernel_busy_ms_per_token','copy_busy_ms_per_token',\
'kernels_per_token')}); c=d['top_kernel_calls_per_token']; \
[print(round(v, 4), c.get(k), k) for k, v in d['top_kernels_ms_per_token'].items()]"
tail -n 5 "$out/log-probe.txt"
bash scripts/gpu_streamed_tiles_33.sh
echo "all done at $(($(date +%s) - begin)) s"
