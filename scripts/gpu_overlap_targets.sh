#!/usr/bin/env bash
# One device call (prepared in the eighteenth session, not yet run): validate what that
# session could not run on the GPU, then the targets' cells at its final code.
#   1. CUDA tests: the shared-expert overlap (whole, piecewise, streamed; every GEMM split
#      along K with the graphs held) and two streams' split-K counters;
#   2. DeepSeek-V2-Lite resident step times and the decode's TPOT (the fork only in captures);
#   3. DeepSeek-V2-Lite unlimited: hf, lru, specter in one process (the unlimited cell);
#   4. DeepSeek-V2-Lite 24 GB: specter, lru, spec-lru in one process (the 24 GB cells).
# Each bench cell: 3 HumanEval prompts x 64 tokens, greedy.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_overlap_targets.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
CUDA_TESTS_TIMEOUT=150 cuda_tests_to gpu-tests-overlap-targets.txt \
    packages/specter-models/tests/test_cuda.py -k "shared_overlap or split_k" \
    packages/specter-kernels/tests/test_gpu.py::test_split_launches_on_two_streams_use_their_own_counters
resident_steps overlap-final 32
tpot_cells 150 unlimited hf,lru,specter overlap-final-unlimited 2.2
tpot_cells 200 24 specter,lru,spec-lru overlap-final-24gb 3.0
