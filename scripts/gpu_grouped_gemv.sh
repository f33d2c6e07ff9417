#!/usr/bin/env bash
# One device call (twenty-fourth session): where the resident steps' time goes now
# (scripts/profile_steps.py at the defaults), and the grouped FP16 expert GEMV swept against
# the per-pair tensor-core kernels at one routed row and five (scripts/sweep_grouped_gemv.py).
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_grouped_gemv.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
timeout 200 python3 scripts/sweep_grouped_gemv.py --out "$out/grouped-gemv-sweep.jsonl" \
    >"$out/log-grouped-gemv.txt" 2>&1
grep -v -i warn "$out/log-grouped-gemv.txt" | cut -c1-160
echo "sweep done at $(($(date +%s) - begin)) s"
timeout 300 python3 scripts/profile_steps.py --tag profile --top 24 \
    --out "$out/profile-steps.jsonl" >"$out/log-profile.txt" 2>&1
grep -v -i warn "$out/log-profile.txt" | cut -c1-130
echo "done at $(($(date +%s) - begin)) s"
