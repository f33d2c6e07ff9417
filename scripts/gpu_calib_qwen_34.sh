#!/usr/bin/env bash
# One device call (thirty-fourth session): the hot set counted on 8 calibration decodes (the
# new default) against 2 on Qwen1.5-MoE at its high budget (20 GB), `specter` alone, 3
# HumanEval prompts x 64 tokens, one process an arm.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_calib_qwen_34.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
for n in 8 2; do
    model_cells qwen1.5-moe 130 20 specter "calib34-qwen-$n-20gb" 1.9 --calibration-prompts "$n"
    echo "qwen $n done at $(($(date +%s) - begin)) s"
done
for f in "$out"/bench-*.jsonl; do
    python3 - "$f" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["kind"] == "hot_experts":
        d = r["data"]
        print(sys.argv[1].split("/")[-1], "hot", d["per_layer"], "slots", d["slots_per_layer"])
    if r["kind"] == "tpot":
        print(" ", r["system"], r["prompt_id"], round(r["tpot_ms"], 2), "MB/token",
              round((r.get("h2d_bytes_per_token") or 0) / 1e6, 1))
PY
done
echo "done at $(($(date +%s) - begin)) s"
