#!/usr/bin/env bash
# One device call, written in the fortieth session for the next one (not yet run): where the
# all-resident plain step's 2.07-2.11 ms go at the current code (the thirty-fifth session's
# kernel-by-kernel sequence was taken at 2.15-2.36 ms, before the 32-key MLA chunks, the
# block merge and the absorbed queries). DeepSeek-V2-Lite, every expert resident, plain
# decoding: one decode token's kernels in launch order with each one's median time and the
# idle gap before it (scripts/plain_step_probe.py --sequence), PDL off (each kernel's own
# time) and early (the shipped mode), one process each.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_sequence_41.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
for pdl in 0 early; do
    SPECTER_KERNELS_PDL=$pdl timeout 150 python3 scripts/plain_step_probe.py \
        --model deepseek-v2-lite --budget-gb 0 --top 30 --sequence \
        --out "$out/plain-step-unlimited41-pdl-$pdl.jsonl" >"$out/log-step-$pdl.txt" 2>&1
    echo "== step, PDL $pdl (rc $?) at $(($(date +%s) - begin)) s"
    tail -n 1 "$out/plain-step-unlimited41-pdl-$pdl.jsonl" | python3 -c "import json,sys; \
d=json.loads(sys.stdin.read()); print({k: d[k] for k in ('tpot_ms','profiled_wall_ms_per_token',\
'kernel_busy_ms_per_token','kernels_per_token')}); s=d['sequence']; \
print(len(s), 'kernels in sequence, sum us', round(sum(r[1] for r in s), 1), 'gaps us', \
round(sum(r[2] for r in s), 1)); [print(*r) for r in s[:40]]"
    tail -n 3 "$out/log-step-$pdl.txt"
done
echo "all done at $(($(date +%s) - begin)) s"
