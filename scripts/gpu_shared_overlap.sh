#!/usr/bin/env bash
# One device call (eighteenth session): the shared experts on a side stream, against in order.
#   1. CUDA tests: the overlap's bit equality (models), two streams' split-K counters (kernels);
#   2. DeepSeek-V2-Lite resident step times, overlap off then on (one process each);
#   3. DeepSeek-V2-Lite unlimited: lru and specter with the overlap, then without;
#   4. Qwen1.5-MoE unlimited: lru and specter with and without.
# Each bench cell: 3 HumanEval prompts x 64 tokens, greedy, one process.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_shared_overlap.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
CUDA_TESTS_TIMEOUT=100 cuda_tests_to gpu-tests-overlap.txt \
    packages/specter-models/tests/test_cuda.py -k shared_overlap \
    packages/specter-kernels/tests/test_gpu.py::test_split_launches_on_two_streams_use_their_own_counters
resident_steps overlap-off 32 --shared-overlap off
resident_steps overlap-on 32 --shared-overlap on
tpot_cells 100 unlimited lru,specter overlap-unlimited 1.3
tpot_cells 100 unlimited lru,specter overlap-off-unlimited 1.3 --shared-overlap off
model_cells qwen1.5-moe 90 unlimited lru,specter overlap-qwen-unlimited 1.2
model_cells qwen1.5-moe 90 unlimited lru,specter overlap-off-qwen-unlimited 1.2 --shared-overlap off
