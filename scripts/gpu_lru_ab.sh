#!/usr/bin/env bash
# One device call (fourteenth session): is the lru baseline's 24 GB time a regression of the
# tree, or the machine? The whole tree at eb57a07 (the twelfth session's 20.26 ms, unpacked
# under ab_old/ by `git archive eb57a07 packages | tar -x -C ab_old`) and this one, lru at
# 24 GB, 3 HumanEval prompts x 64 tokens, one process each (old, new); then the unlimited
# cells (hf, lru, specter) with the 32-column per-pair tile, and specter-models' CUDA
# exactness tests of the streamed and budget paths.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_lru_ab.sh
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
new_path="$PYTHONPATH"
old_path="${PYTHONPATH//$PWD\/packages/$PWD/ab_old/packages}"
PYTHONPATH="$old_path" tpot_cells 190 24 lru lru-ab-old 1.4
PYTHONPATH="$new_path" tpot_cells 190 24 lru lru-ab-new 1.4
PYTHONPATH="$new_path" tpot_cells 190 unlimited hf,lru,specter per-pair-unlimited 2.4
CUDA_TESTS_TIMEOUT=120 cuda_tests_to gpu-tests-per-pair.txt \
    packages/specter-models/tests/test_cuda.py -k "streamed or budget"
