#!/usr/bin/env bash
# One device call (nineteenth session, after gpu_mla_prologue.sh): the MLA prologue with the
# complex rotary kernels compiled without contraction (the first call found the one-launch
# prologue's bits off its parts' at 200 rows). In order: the CUDA tests (the prologue against
# its parts at DeepSeek-V2-Lite's sizes, the rotary kernels, the tiny model's bits with it on
# and off, graphed decoding); DeepSeek-V2-Lite resident step times off, on, off, on (one
# process each, interleaved); the unlimited cell (hf, lru, specter in one process) with it on.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_mla_prologue_ab.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
CUDA_TESTS_TIMEOUT=200 cuda_tests_to gpu-tests-mla-prologue-ab.txt \
    packages/specter-kernels/tests/test_gpu.py -k "mla_prologue or rotary_complex" \
    packages/specter-models/tests/test_cuda.py \
    -k "mla_prologue or fused_rotary or window_forward_bit or graphed_speculation_equals"
for arm in off-1 on-1 off-2 on-2; do
    SPECTER_MLA_PROLOGUE=$([[ $arm == on-* ]] && echo 1 || echo 0) \
        resident_steps "prologue-$arm" 32
done
tpot_cells 170 unlimited hf,lru,specter prologue-ab-unlimited 2.4
