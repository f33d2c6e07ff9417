#!/usr/bin/env bash
# One device call (thirty-fourth session): the hot set counted on 8 calibration decodes (the
# new default) against 2 (the old), DeepSeek-V2-Lite at 24 GB, 3 HumanEval prompts x 64
# tokens, one process an arm: `specter` and `lru` with 8, then `specter` with 2.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_calib_34.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
hot() {
    python3 - "$out/bench-deepseek-v2-lite-$1.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["kind"] == "hot_experts":
        d = r["data"]
        print("hot", d["per_layer"], "slots", d["slots_per_layer"], d["calibration_prompts"])
    if r["kind"] == "tpot" and r["system"] == "specter":
        print(r["prompt_id"], round(r["tpot_ms"], 2), "MB/token",
              round((r.get("h2d_bytes_per_token") or 0) / 1e6, 1), "hit", r.get("hit_rate"))
PY
}
tpot_cells 280 24 specter,lru calib34-8-24gb 4.2
hot calib34-8-24gb
echo "8 done at $(($(date +%s) - begin)) s"
tpot_cells 200 24 specter calib34-2-24gb 3.0 --calibration-prompts 2
hot calib34-2-24gb
echo "done at $(($(date +%s) - begin)) s"
