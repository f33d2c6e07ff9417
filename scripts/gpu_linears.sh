#!/usr/bin/env bash
# One device call: the invariant GEMM's tiles and K splits swept inside CUDA graphs, then
# DeepSeek-V2-Lite's resident decode steps with the shipped tiles, the swept ones, and the
# swept ones in the draft too, each in its own process:
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_linears.sh
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
python3 -m pytest -q -p no:cacheprovider packages/specter-kernels/tests/invariant/test_gpu_batch_invariance.py \
    -k "split_k or linear" 2>&1 | tail -3 | tee "$out/gpu-tests-split-k.txt"
python3 scripts/sweep_invariant_matmul.py --out "$out/invariant-matmul-graph-sweep.jsonl" \
    --write-config "$out/invariant_matmul_nvidia_h200.json" --max-seconds "${SWEEP_SECONDS:-200}" \
    2>&1 | grep -v "Error" | tee "$out/log-sweep.txt"
steps() {  # tag, then extra gpu_step_graphs.py arguments
    local tag="$1"
    shift
    timeout 150 python3 scripts/gpu_step_graphs.py --skip eager,fused,rotary,budget --tag "$tag" \
        --out "$out/steps-$tag.jsonl" "$@" 2>&1 | grep -E '"kind": "(step|decode|decode_equal)"' \
        | cut -c1-220
}
steps shipped
export SPECTER_INVARIANT_MATMUL_CONFIGS="$out/invariant_matmul_nvidia_h200.json"
steps swept
steps swept-draft --invariant-draft-linears
