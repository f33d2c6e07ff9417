#!/usr/bin/env bash
# One device call (eighteenth session): DeepSeek-V2-Lite's specter at 24 GB, TPOT against a
# fixed depth K on each of 3 HumanEval prompts x 64 tokens, beside the adaptive depth, one
# process (one load, its pinned hot set): where the adaptive depth should settle.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_depth_curve.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
tpot_cells 330 24 specter depth-curve-24gb 4.5 --experiment depth-sweep \
    --depths "${DEPTHS:-1,2,3,4,6,8}" --sweep-prompts 3
python3 - "$out" <<'PY'
import glob, json, sys
for path in glob.glob(f"{sys.argv[1]}/*depth-curve*.jsonl"):
    for line in open(path):
        r = json.loads(line)
        if r["kind"] == "depth_sweep":
            for p in r["data"]["points"]:
                print("K", p["depth"], round(p["tpot_ms"], 2), p["acceptance_rate"],
                      {k: round(v, 2) for k, v in p["prompt_tpot_ms"].items()})
        elif r["kind"] == "tpot":
            print(r["system"], r["prompt_id"], round(r["tpot_ms"], 2), r["depth"])
PY
