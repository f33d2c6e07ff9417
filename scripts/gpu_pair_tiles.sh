#!/usr/bin/env bash
# One device call (twenty-fourth session): the PDL chain tests (at eca61ec with the router,
# whose constant weight was then loaded before its PDL wait) and the per-pair tiles of the grouped
# FP16 experts swept at one routed row and five (scripts/sweep_per_pair_tiles.py). At eca61ec
# the call also timed DeepSeek-V2-Lite's resident steps with the router's preload and without
# it (2.139 against 2.143 ms a one-row target step: no gain, so the preload was reverted and
# that A/B arm, which needs eca61ec's router_topk(constant_weight=), is not kept here).
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_pair_tiles.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
CUDA_TESTS_TIMEOUT=100 cuda_tests_to gpu-tests-pdl.txt \
    packages/specter-kernels/tests/test_pdl.py
echo "tests done at $(($(date +%s) - begin)) s"
timeout 260 python3 scripts/sweep_per_pair_tiles.py --max-seconds 100 \
    --out "$out/per-pair-tiles.jsonl" >"$out/log-per-pair-tiles.txt" 2>&1
python3 - "$out/per-pair-tiles.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for r in rows:
    r["w"] = 3 * r["us_m1"] + r["us_m5"]
for part in ("shipped", "gate_up", "down"):
    best = sorted((r for r in rows if r["part"] == part), key=lambda r: r["w"])[:6]
    for r in best:
        t = r["tile"]
        print(part, t["block_n"], t["block_k"], t["num_warps"], t["num_stages"],
              round(r["us_m1"], 2), round(r["us_m5"], 2), r["invariant"], f"{r['max_err']:.1e}")
print("non-invariant:", sum(not r["invariant"] for r in rows), "of", len(rows))
PY
echo "done at $(($(date +%s) - begin)) s"
