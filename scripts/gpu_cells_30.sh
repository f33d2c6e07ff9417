#!/usr/bin/env bash
# One device call (thirtieth session): the CUDA test of layer-wise plans from the graphed
# draft (now the default), then the targets' cells at the session's code: 24 GB (specter,
# lru, spec-lru) and unlimited (hf, lru, specter), DeepSeek-V2-Lite, 3 HumanEval prompts x
# 64 tokens, one process each.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_cells_30.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
cuda_tests_to gpu-tests.txt packages/specter-models/tests/test_cuda.py -k "layerwise"
echo "tests done at $(($(date +%s) - begin)) s"
tpot_cells 200 24 specter,lru,spec-lru cells30-24gb 3.0
echo "24 GB done at $(($(date +%s) - begin)) s"
tpot_cells 170 unlimited hf,lru,specter cells30-unlimited 2.6
echo "done at $(($(date +%s) - begin)) s"
