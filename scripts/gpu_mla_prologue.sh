#!/usr/bin/env bash
# One device call (nineteenth session): DeepSeek-V2's MLA prologue in one launch
# (specter-kernels mla_prologue: the latent norm, both rotations and the two cache writes).
# In order: the CUDA tests (the kernel gives its parts' bits at DeepSeek-V2-Lite's sizes; the
# tiny model's logits, greedy tokens and cache rows equal with it on and off, resident,
# piecewise and streamed); DeepSeek-V2-Lite resident step times with it off and on (one
# process each; each decodes plainly and speculatively and checks equal tokens); the
# unlimited cell (hf, lru, specter in one process) with it on.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_mla_prologue.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
CUDA_TESTS_TIMEOUT=200 cuda_tests_to gpu-tests-mla-prologue.txt \
    packages/specter-kernels/tests/test_gpu.py -k "mla_prologue or rotary_complex" \
    packages/specter-models/tests/test_cuda.py -k "mla_prologue or fused_rotary or fused_rms_norm"
SPECTER_MLA_PROLOGUE=0 resident_steps prologue-off 32
SPECTER_MLA_PROLOGUE=1 resident_steps prologue-on 32
tpot_cells 170 unlimited hf,lru,specter prologue-unlimited 2.4
