#!/usr/bin/env bash
# One device call (twenty-third session): the 1/2-warp tuned GEMV tiles (now shipped) and
# the PDL `early` mode with the GEMV's weight preload. The PDL and GEMV CUDA tests;
# DeepSeek-V2-Lite's resident steps at the defaults and with `early` + preload (one process
# each); its unlimited cell (hf, lru, specter) and 24 GB cell (specter, lru) at the
# defaults; and, when `early` + preload made the one-row target step at least 0.03 ms
# faster, the unlimited cell's specter and lru with it.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_pdl_early.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
CUDA_TESTS_TIMEOUT=100 cuda_tests_to gpu-tests-early.txt packages/specter-kernels/tests/test_pdl.py \
    packages/specter-kernels/tests/invariant/test_gpu_batch_invariance.py -k "pdl or gemv or linear"
echo "tests done at $(($(date +%s) - begin)) s"
resident_steps default 32
(export SPECTER_KERNELS_PDL=early SPECTER_INVARIANT_GEMV_PRELOAD=1; resident_steps early 32)
echo "steps done at $(($(date +%s) - begin)) s"
gain=$(python3 - "$out/steps-default.jsonl" "$out/steps-early.jsonl" <<'PY'
import json, sys
t1 = [next(r["ms"] for r in map(json.loads, open(p)) if r["kind"] == "step"
           and r["role"] == "target" and r["rows"] == 1) for p in sys.argv[1:]]
print(1 if t1[0] - t1[1] >= 0.03 else 0)
PY
)
tpot_cells 170 unlimited hf,lru,specter warps-unlimited 2.6
echo "unlimited done at $(($(date +%s) - begin)) s"
tpot_cells 120 24 specter,lru warps-24gb 1.9
echo "24 GB done at $(($(date +%s) - begin)) s"
if [ "$gain" = 1 ]; then
    (export SPECTER_KERNELS_PDL=early SPECTER_INVARIANT_GEMV_PRELOAD=1
     tpot_cells 120 unlimited lru,specter early-unlimited 1.8)
fi
echo "done at $(($(date +%s) - begin)) s"
