#!/usr/bin/env bash
# One device call (sixteenth session): programmatic dependent launch (PDL) of the Triton
# kernels. In order: specter-kernels' CUDA tests with PDL on (the default), including the
# chain-of-kernels bit check with and without PDL, eager and in a CUDA graph; DeepSeek-V2-Lite
# step times, every expert resident, graphs replayed, with PDL off and on (one process each,
# each decoding plainly and speculatively and checking equal tokens); specter-models' CUDA
# tests with PDL on.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_pdl.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
CUDA_TESTS_TIMEOUT=200 cuda_tests_to gpu-tests-pdl.txt packages/specter-kernels/tests/test_pdl.py \
    packages/specter-kernels/tests/test_gpu.py packages/specter-kernels/tests/test_gpu_batch_invariance.py
steps() {  # TAG [ARGS...]: resident step times and the decode check, one process
    local tag=$1
    shift
    timeout 150 python3 scripts/gpu_step_graphs.py --skip eager,fused,rotary,routers,mla,mlp,budget \
        --tokens 32 --tag "$tag" --out "$out/steps-$tag.jsonl" "$@" >"$out/log-steps-$tag.txt" 2>&1
    python3 - "$out/steps-$tag.jsonl" "$tag" <<'PY'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
steps = {(r["role"], r["rows"]): r["ms"] for r in rows if r["kind"] == "step"}
dec = {r["depth"]: r["ms_per_token"] for r in rows if r["kind"] == "decode"}
eq = [r["equal"] for r in rows if r["kind"] == "decode_equal"]
print(sys.argv[2], {f"{k[0]}{k[1]}": round(v, 3) for k, v in steps.items()},
      {f"K{k}": round(v, 2) for k, v in dec.items()}, "equal", eq)
PY
}
SPECTER_KERNELS_PDL=0 steps pdl-off
SPECTER_KERNELS_PDL=1 steps pdl-on
SPECTER_KERNELS_PDL=0 steps pdl-off-again
CUDA_TESTS_TIMEOUT=200 cuda_tests_to gpu-tests-pdl-models.txt packages/specter-models/tests/test_cuda.py
