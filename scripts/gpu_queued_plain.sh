#!/usr/bin/env bash
# One device call (seventeenth session): plain steps queued one ahead of their token's
# read-back (specter-spec `pipeline_plain`, on by default on CUDA when every expert is
# resident). In order:
#   1. specter-spec's CUDA tests (queued steps against in-order steps, greedy and sampled;
#      the phase clock);
#   2. DeepSeek-V2-Lite unlimited: hf, lru and specter at this tree;
#   3. the same unlimited cells (lru, specter) at the tree before this session, unpacked under
#      .ab/old by `git archive <base> packages scripts | tar -x -C .ab/old`;
#   4. the 24 GB targets' cells (specter, lru, spec-lru) at this tree, where nothing queues
#      (a budget keeps every iteration in order): the first GPU run after the sixteenth
#      session's per-launch settings fix.
# Each cell: 3 HumanEval prompts x 64 tokens, greedy, one process.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_queued_plain.sh   (carry .ab and .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
new_path="$PYTHONPATH"
old_path="${PYTHONPATH//$PWD\/packages/$PWD/.ab/old/packages}"
CUDA_TESTS_TIMEOUT=90 cuda_tests_to gpu-tests-queued-plain.txt \
    packages/specter-spec/tests/test_queued_steps.py packages/specter-spec/tests/test_phase_clock.py
PYTHONPATH="$new_path" tpot_cells 175 unlimited hf,lru,specter queued-unlimited 2.5
PYTHONPATH="$old_path" tpot_cells 130 unlimited lru,specter queued-old-unlimited 1.8
PYTHONPATH="$new_path" tpot_cells 175 24 specter,lru,spec-lru queued-24gb 2.6
