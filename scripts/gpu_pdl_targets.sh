#!/usr/bin/env bash
# One device call (sixteenth session): the PDL mode A/B, then the targets at the chosen mode.
# specter-kernels' PDL tests (both modes, bits against PDL off, eagerly and in a CUDA graph);
# DeepSeek-V2-Lite's resident step times with SPECTER_KERNELS_PDL=0, wait and trigger, one
# process each (each also decodes plainly and speculatively and checks equal tokens); the mode
# with the least draft + target(1 row) + target(5 rows) time is then used for the targets' TPOT
# cells: 24 GB (specter, lru, spec-lru) and unlimited (hf, lru, specter), one process each,
# 3 HumanEval prompts x 64 tokens.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_pdl_targets.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
CUDA_TESTS_TIMEOUT=60 cuda_tests_to gpu-tests-pdl-modes.txt packages/specter-kernels/tests/test_pdl.py
for mode in 0 wait trigger; do
    SPECTER_KERNELS_PDL=$mode resident_steps "pdl-$mode" 16
done
best=$(python3 - "$out" <<'PY'
import json, sys
best, score = "0", None
for mode in ("0", "wait", "trigger"):
    try:
        rows = [json.loads(line) for line in open(f"{sys.argv[1]}/steps-pdl-{mode}.jsonl")]
    except OSError:
        continue
    steps = {(r["role"], r["rows"]): r["ms"] for r in rows if r["kind"] == "step"}
    equal = all(r["equal"] for r in rows if r["kind"] == "decode_equal")
    total = sum(steps.values()) if len(steps) == 3 and equal else None
    print(mode, {f"{k[0]}{k[1]}": round(v, 3) for k, v in steps.items()}, "equal", equal,
          file=sys.stderr)
    if total is not None and (score is None or total < score):
        best, score = mode, total
print(best)
PY
)
echo "PDL mode for the targets: $best"
export SPECTER_KERNELS_PDL=$best
tpot_cells 170 24 specter,lru,spec-lru pdl-24gb 2.6
tpot_cells 170 unlimited hf,lru,specter pdl-unlimited 2.2
