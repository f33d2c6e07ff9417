#!/usr/bin/env bash
# One device call (nineteenth session, run at e3b84d2; the prefetch was reverted after it): the invariant GEMM's weight prefetch before the PDL
# wait (specter-kernels pdl.prefetch_l2). In order: the PDL CUDA tests (the chain of kernels
# gives the same bits with the prefetch on and off, eagerly and in a graph); DeepSeek-V2-Lite
# resident step times with the prefetch off and on under PDL `wait`, and on under `trigger`
# (one process each; each also decodes plainly and speculatively and checks equal tokens);
# then the unlimited cell (hf, lru, specter in one process) under the arm whose one-row
# target step was fastest.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_weight_prefetch.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
CUDA_TESTS_TIMEOUT=150 cuda_tests_to gpu-tests-weight-prefetch.txt \
    packages/specter-kernels/tests/test_pdl.py
SPECTER_KERNELS_PDL=wait SPECTER_KERNELS_PREFETCH=0 resident_steps prefetch-off-wait 32
SPECTER_KERNELS_PDL=wait SPECTER_KERNELS_PREFETCH=1 resident_steps prefetch-on-wait 32
SPECTER_KERNELS_PDL=trigger SPECTER_KERNELS_PREFETCH=1 resident_steps prefetch-on-trigger 32
best=$(python3 - "$out" <<'PY'
import json, sys
best = None
for arm in ("prefetch-off-wait", "prefetch-on-wait", "prefetch-on-trigger"):
    rows = [json.loads(l) for l in open(f"{sys.argv[1]}/steps-{arm}.jsonl")]
    ms = [r["ms"] for r in rows if r["kind"] == "step" and r["role"] == "target" and r["rows"] == 1]
    if ms and (best is None or ms[0] < best[1]):
        best = (arm, ms[0])
print(best[0] if best else "prefetch-off-wait")
PY
)
echo "fastest one-row target step: $best"
mode=${best##*-}
prefetch=$([[ $best == prefetch-on-* ]] && echo 1 || echo 0)
SPECTER_KERNELS_PDL=$mode SPECTER_KERNELS_PREFETCH=$prefetch \
    tpot_cells 170 unlimited hf,lru,specter "$best-unlimited" 2.4
