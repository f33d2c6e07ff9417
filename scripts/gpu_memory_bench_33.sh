#!/usr/bin/env bash
# One device call (thirty-third session): the bench's own memory records after the one-stream
# fix: DeepSeek-V2-Lite at 24 GB, `lru` then `spec-lru` in one process (two stages: the second
# loads after the first's graphs), 3 HumanEval prompts x 64 tokens; prints each stage's
# planned, load and decode peaks.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_memory_bench_33.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
tpot_cells 160 24 lru,spec-lru memory33-24gb 2.5
python3 - "$out/bench-deepseek-v2-lite-memory33-24gb.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["kind"] == "memory":
        d = r["data"]
        print(d["policy"], "draft" if d["with_draft"] else "no draft", "plan",
              round(d["expected_peak_gb"], 3), "load", round(d["load_peak_gb"], 3),
              "decode", round(d["measured_peak_gb"] or 0, 3))
PY
echo "done at $(($(date +%s) - begin)) s"
