#!/usr/bin/env bash
# One device call (twentieth session): the fused residual adds and the MLA key chunk.
# In order: the CUDA tests (the two residual kernels' bits against their parts at
# DeepSeek-V2-Lite's hidden size; the tiny DeepSeek-V2 and Qwen2-MoE models' logits and
# greedy tokens with the adds fused and apart, resident, piecewise and streamed; the shared
# overlap and MLA prologue tests beside them); the MLA key-chunk sweep (sweep_mla_split.py);
# DeepSeek-V2-Lite resident step times, one process per arm, interleaved: the adds apart or
# fused (SPECTER_FUSED_RESIDUALS), at key chunks 64, 32 and 16 (SPECTER_MLA_SPLIT). Arms are
# skipped once the call has run 500 s.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_fused_residuals.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
CUDA_TESTS_TIMEOUT=200 cuda_tests_to gpu-tests-fused-residuals.txt \
    packages/specter-kernels/tests/test_gpu.py -k "fused_residual or mla" \
    packages/specter-models/tests/test_cuda.py \
    -k "fused_residuals or mla_prologue or shared or graphed_speculation_equals"
echo "tests done at $(($(date +%s) - begin)) s"
timeout 120 python3 scripts/sweep_mla_split.py --lengths 64,264,600,2100 \
    --out "$out/mla-split.jsonl" >"$out/log-mla-split.txt" 2>&1
python3 - "$out/mla-split.jsonl" <<'PY'
import json, sys
for r in map(json.loads, open(sys.argv[1])):
    print(f"L={r['L']:5d} T={r['T']} split={r['split']:3d}/{r['block_l']:2d} "
          f"{r['us']:7.2f} us  err {r['max_rel_err']:.1e}")
PY
echo "sweep done at $(($(date +%s) - begin)) s"
for arm in 0-64 1-64 1-32 1-16 0-64b 1-32b; do
    if (($(date +%s) - begin > 500)); then
        echo "arm $arm skipped at $(($(date +%s) - begin)) s"
        continue
    fi
    fused=${arm%%-*}
    split=${arm#*-}
    SPECTER_FUSED_RESIDUALS=$fused SPECTER_MLA_SPLIT=${split%b} \
        resident_steps "residuals-$arm" 32
done
echo "done at $(($(date +%s) - begin)) s"
