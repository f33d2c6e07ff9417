#!/usr/bin/env bash
# One device call (twenty-first session): the W4A16 gemv path's packed f16x2 math (math 3,
# int4_triton.int4_word_dot8). In order: the CUDA tests (the packed math's PTX against float64
# sums; the fused W4A16 kernel at real shapes with the default math and with math 3; the
# tiny models' bit tests refactored at b72d72c, never run on a GPU since); DeepSeek-V2-Lite
# resident step times with SPECTER_W4A16_MATH=0 and 3, one process per arm, interleaved; the
# gemv tile/math sweep (scripts/sweep_int4_gemv.py) for DeepSeek-V2-Lite and Phi-3.5-MoE.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_int4_gemv.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
CUDA_TESTS_TIMEOUT=100 cuda_tests_to gpu-tests-int4-gemv.txt \
    packages/specter-kernels/tests/quant/test_int4_triton.py packages/specter-kernels/tests/test_gpu.py \
    -k "word_dot8 or w4a16"
SPECTER_W4A16_MATH=3 CUDA_TESTS_TIMEOUT=60 cuda_tests_to gpu-tests-int4-gemv.txt \
    packages/specter-kernels/tests/test_gpu.py -k "w4a16"
SPECTER_W4A16_MATH=3 CUDA_TESTS_TIMEOUT=200 cuda_tests_to gpu-tests-int4-gemv.txt \
    packages/specter-models/tests/test_cuda.py \
    -k "value_projection or fused_residuals or speculation_is_exact or shared_overlap or prologue"
echo "tests done at $(($(date +%s) - begin)) s"
for arm in 0 3 0b 3b; do
    SPECTER_W4A16_MATH=${arm%b} resident_steps "w4math-$arm" 32
done
echo "steps done at $(($(date +%s) - begin)) s"
timeout $((560 - ($(date +%s) - begin))) python3 scripts/sweep_int4_gemv.py \
    --out "$out/int4-gemv-sweep.jsonl" >"$out/log-int4-gemv-sweep.txt" 2>&1
grep "==\|done\|Error" "$out/log-int4-gemv-sweep.txt"
echo "done at $(($(date +%s) - begin)) s"
