#!/usr/bin/env bash
# One device call (twenty-third session): the GEMV sweep with one- and two-warp tiles
# (DeepSeek-V2-Lite's shapes) written to a new tuned file, then DeepSeek-V2-Lite's resident
# steps, one process an arm: the shipped tiles; the new tiles; the new tiles with PDL
# `trigger`; the new tiles with PDL `trigger` and the GEMV's weight loads before its wait
# (SPECTER_INVARIANT_GEMV_PRELOAD=1).
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_gemv_preload.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
timeout 200 python3 scripts/sweep_invariant_gemv.py --max-seconds 150 --shapes dsv2 \
    --out "$out/gemv-sweep-warps.jsonl" --write-config "$out/invariant_gemv_warps.json" \
    >"$out/log-gemv-sweep.txt" 2>&1
grep -v -i warn "$out/log-gemv-sweep.txt" | cut -c1-230 | tail -14
echo "sweep done at $(($(date +%s) - begin)) s"
# The new file: the sweep's entries, the shipped file's for shapes it did not reach.
new="$out/invariant_gemv_warps.json"
python3 - "$new" packages/specter-kernels/src/specter_kernels/tuned/invariant_gemv_nvidia_h200.json <<'PY'
import json, sys
try:
    new = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    new = {"configs": []}
shipped = json.load(open(sys.argv[2]))
have = {(e["N"], e["K"], e["dtype"]) for e in new["configs"]}
kept = [e for e in shipped["configs"] if (e["N"], e["K"], e["dtype"]) not in have]
new = {**shipped, **{k: v for k, v in new.items() if k != "configs"}, "configs": new["configs"] + kept}
json.dump(new, open(sys.argv[1], "w"), indent=1)
print("new tuned file:", len(new["configs"]) - len(kept), "swept,", len(kept), "kept from the shipped file")
for e in new["configs"][:12]:
    print(" ", e["N"], e["K"], e["dtype"], e["kernel"], e.get("block_n"), e.get("num_warps"), e["gemv_graph_us_m1"], e["gemv_graph_us_m5"])
PY
resident_steps shipped 32
echo "at $(($(date +%s) - begin)) s"
(export SPECTER_INVARIANT_GEMV_CONFIGS=$new; resident_steps warps 32)
echo "at $(($(date +%s) - begin)) s"
(export SPECTER_INVARIANT_GEMV_CONFIGS=$new SPECTER_KERNELS_PDL=trigger; resident_steps trigger 32)
echo "at $(($(date +%s) - begin)) s"
(export SPECTER_INVARIANT_GEMV_CONFIGS=$new SPECTER_KERNELS_PDL=trigger SPECTER_INVARIANT_GEMV_PRELOAD=1
 resident_steps preload 32)
echo "done at $(($(date +%s) - begin)) s"
