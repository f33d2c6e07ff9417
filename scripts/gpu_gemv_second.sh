#!/usr/bin/env bash
# One device call: the GEMV sweep at DeepSeek-V2-Lite's shapes (rows a pass swept too), the
# resident steps with its tuned tiles (the draft's linears through the GEMV as well) against
# the GEMV off, then the sweep at the other models' shapes.
source "$(dirname "$0")/gpu-call.sh"
timeout 150 python3 scripts/sweep_invariant_gemv.py --max-seconds 120 --shapes dsv2 \
    --out "$out/gemv-sweep-dsv2.jsonl" --write-config "$out/invariant_gemv_dsv2.json" \
    >"$out/log-gemv-sweep-dsv2.txt" 2>&1
grep -v -i warn "$out/log-gemv-sweep-dsv2.txt" | cut -c1-230 | tail -14
export SPECTER_INVARIANT_GEMV_CONFIGS="$out/invariant_gemv_dsv2.json"
SPECTER_INVARIANT_GEMV=0 resident_steps gemv-off 32
SPECTER_INVARIANT_GEMV=1 resident_steps gemv-tuned-draft 32 --invariant-draft-linears
timeout 200 python3 scripts/sweep_invariant_gemv.py --max-seconds 150 --shapes qwen,phi \
    --out "$out/gemv-sweep-others.jsonl" --write-config "$out/invariant_gemv_others.json" \
    >"$out/log-gemv-sweep-others.txt" 2>&1
grep -v -i warn "$out/log-gemv-sweep-others.txt" | cut -c1-230 | tail -14
