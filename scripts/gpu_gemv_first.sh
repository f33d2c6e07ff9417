#!/usr/bin/env bash
# One device call: the GEMV sweep at DeepSeek-V2-Lite's shapes, then the resident steps with
# the GEMV (heuristic tiles) and without it (SPECTER_INVARIANT_GEMV=0), one process each.
source "$(dirname "$0")/gpu-call.sh"
SPECTER_INVARIANT_GEMV=1 resident_steps gemv-on 32
SPECTER_INVARIANT_GEMV=0 resident_steps gemv-off 32
timeout 300 python3 scripts/sweep_invariant_gemv.py --max-seconds 230 --shapes dsv2 \
    --out "$out/gemv-sweep.jsonl" --write-config "$out/invariant_gemv_nvidia_h200.json" \
    >"$out/log-gemv-sweep.txt" 2>&1
grep -v -i warn "$out/log-gemv-sweep.txt" | cut -c1-230 | tail -30
