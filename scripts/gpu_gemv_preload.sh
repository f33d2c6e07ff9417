#!/usr/bin/env bash
# One device call (twenty-third session): the GEMV sweep with one- and two-warp tiles
# (DeepSeek-V2-Lite's shapes) written to a new tuned file, then DeepSeek-V2-Lite's resident
# steps, one process an arm: the shipped tiles; the new tiles; the new tiles with PDL
# `trigger`; the new tiles with PDL `trigger` and the GEMV's weight loads before its wait
# (SPECTER_INVARIANT_GEMV_PRELOAD=1).
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_gemv_preload.sh   (carry .whl)
# (Run at 83ea016 with an inline merge of the tuned files; since 0af221c the sweep's
# --keep-from does that merge.)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
# The new file: the sweep's entries, the shipped file's for shapes it did not reach.
new="$out/invariant_gemv_warps.json"
timeout 200 python3 scripts/sweep_invariant_gemv.py --max-seconds 150 --shapes dsv2 \
    --out "$out/gemv-sweep-warps.jsonl" --write-config "$new" \
    --keep-from packages/specter-kernels/src/specter_kernels/invariant/tuned/invariant_gemv_nvidia_h200.json \
    >"$out/log-gemv-sweep.txt" 2>&1
grep -v -i warn "$out/log-gemv-sweep.txt" | cut -c1-230 | tail -14
echo "sweep done at $(($(date +%s) - begin)) s"
resident_steps shipped 32
echo "at $(($(date +%s) - begin)) s"
(export SPECTER_INVARIANT_GEMV_CONFIGS=$new; resident_steps warps 32)
echo "at $(($(date +%s) - begin)) s"
(export SPECTER_INVARIANT_GEMV_CONFIGS=$new SPECTER_KERNELS_PDL=trigger; resident_steps trigger 32)
echo "at $(($(date +%s) - begin)) s"
(export SPECTER_INVARIANT_GEMV_CONFIGS=$new SPECTER_KERNELS_PDL=trigger SPECTER_INVARIANT_GEMV_PRELOAD=1
 resident_steps preload 32)
echo "done at $(($(date +%s) - begin)) s"
