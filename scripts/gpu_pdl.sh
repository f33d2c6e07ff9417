#!/usr/bin/env bash
# One device call (sixteenth session): programmatic dependent launch (PDL) of the Triton
# kernels, in the mode that launches the successor at once (`trigger`, the only mode at
# fafc2ce). In order: specter-kernels' CUDA tests with PDL on (the default), including the
# chain-of-kernels bit check with and without PDL, eager and in a CUDA graph; DeepSeek-V2-Lite
# step times, every expert resident, graphs replayed, with PDL off and on (one process each,
# each decoding plainly and speculatively and checking equal tokens); specter-models' CUDA
# tests with PDL on.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_pdl.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
CUDA_TESTS_TIMEOUT=200 cuda_tests_to gpu-tests-pdl.txt packages/specter-kernels/tests/test_pdl.py \
    packages/specter-kernels/tests/test_gpu.py packages/specter-kernels/tests/invariant/test_gpu_batch_invariance.py
SPECTER_KERNELS_PDL=0 resident_steps pdl-off 32
SPECTER_KERNELS_PDL=trigger resident_steps pdl-on 32  # at fafc2ce "1" meant trigger
SPECTER_KERNELS_PDL=0 resident_steps pdl-off-again 32
CUDA_TESTS_TIMEOUT=200 cuda_tests_to gpu-tests-pdl-models.txt packages/specter-models/tests/test_cuda.py
