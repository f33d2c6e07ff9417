#!/usr/bin/env bash
# One device call (twenty-first session, after gpu_int4_gemv.sh): the W4A16 gemv path's new
# defaults (narrow tiles, the packed f16x2 math). In order: the CUDA tests (the packed math's
# PTX; the fused W4A16 kernel at real shapes with math 3 and 0); the focused gemv sweep
# (scripts/sweep_int4_gemv.py: math 0 and 3 at the new tiles, the old tiles); DeepSeek-V2-Lite
# resident step times, one process per arm, interleaved: the old tiles with math 0 (the code
# before this session, gemv_configs patched back), the new tiles with math 0, and with math 3
# (the new default); then DeepSeek-V2-Lite's unlimited cell (hf, lru, specter, one process).
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_int4_defaults.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
CUDA_TESTS_TIMEOUT=100 cuda_tests_to gpu-tests-int4-defaults.txt \
    packages/specter-kernels/tests/quant/test_int4_triton.py packages/specter-kernels/tests/test_gpu.py \
    -k "word_dot8 or w4a16"
SPECTER_W4A16_MATH=0 CUDA_TESTS_TIMEOUT=60 cuda_tests_to gpu-tests-int4-defaults.txt \
    packages/specter-kernels/tests/test_gpu.py -k "w4a16"
echo "tests done at $(($(date +%s) - begin)) s"
timeout 120 python3 scripts/sweep_int4_gemv.py --out "$out/int4-gemv-sweep-2.jsonl" \
    >"$out/log-int4-gemv-sweep-2.txt" 2>&1
grep "==\|done\|Error" "$out/log-int4-gemv-sweep-2.txt"
echo "sweep done at $(($(date +%s) - begin)) s"
# The old tiles: gemv_configs as it was at b72d72c, patched in before the step script runs.
legacy_gemv_site
for arm in legacy new0 new3 legacyb new0b new3b; do
    case $arm in
        legacy*) PYTHONPATH="/tmp/legacy-gemv:$PYTHONPATH" resident_steps "w4-$arm" 32 ;;
        new0*) SPECTER_W4A16_MATH=0 resident_steps "w4-$arm" 32 ;;
        *) resident_steps "w4-$arm" 32 ;;
    esac
done
grep -h "legacy gemv" "$out"/log-steps-w4-legacy*.txt | head -2
echo "steps done at $(($(date +%s) - begin)) s"
tpot_cells 200 unlimited hf,lru,specter int4-unlimited 2.9
echo "done at $(($(date +%s) - begin)) s"
