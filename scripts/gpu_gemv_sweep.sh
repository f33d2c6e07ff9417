#!/usr/bin/env bash
# One device call: the batch-invariant GEMV swept against the tensor-core invariant matmul
# and cuBLAS (scripts/sweep_invariant_gemv.py), DeepSeek-V2-Lite's shapes first. The tuned
# file it writes keeps the shipped file's entries for the shapes not swept
# (SWEEP_SHAPES=qwen,phi sweeps those two models' shapes only).
source "$(dirname "$0")/gpu-call.sh"
timeout 450 python3 scripts/sweep_invariant_gemv.py --max-seconds "${SWEEP_SECONDS:-330}" \
    --out "$out/gemv-sweep.jsonl" --write-config "$out/invariant_gemv_nvidia_h200.json" \
    --keep-from packages/specter-kernels/src/specter_kernels/invariant/tuned/invariant_gemv_nvidia_h200.json \
    ${SWEEP_SHAPES:+--shapes "$SWEEP_SHAPES"} >"$out/log-gemv-sweep.txt" 2>&1
grep -v -i warn "$out/log-gemv-sweep.txt" | cut -c1-230 | tail -40
