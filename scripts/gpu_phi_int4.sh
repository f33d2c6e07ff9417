#!/usr/bin/env bash
# One device call (twenty-first session): Phi-3.5-MoE with the W4A16 gemv path's new defaults
# (narrow tiles, the packed f16x2 math; its draft layer went 60 -> 39 us in the sweep). The
# CUDA tests of the packed math's Triton-ops form on the GPU; Phi-3.5-MoE's unlimited cell
# (hf, lru, specter, one process); then specter alone at unlimited with the old gemv tiles and
# math patched back (the same sitecustomize as gpu_int4_defaults.sh), for the A/B.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_phi_int4.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
CUDA_TESTS_TIMEOUT=60 cuda_tests_to gpu-tests-phi-int4.txt \
    packages/specter-kernels/tests/quant/test_int4_triton.py
phi() {
    model_cells phi-3.5-moe "$@" --num-prompts 1 --max-new-tokens 32
}
phi 200 unlimited hf,lru,specter phi-int4-unlimited 3.0
echo "new done at $(($(date +%s) - begin)) s"
legacy_gemv_site
PYTHONPATH="/tmp/legacy-gemv:$PYTHONPATH" phi 170 unlimited specter phi-legacy-unlimited 2.5
grep -c "legacy gemv" "$out/log-phi-legacy-unlimited.txt"
echo "done at $(($(date +%s) - begin)) s"
