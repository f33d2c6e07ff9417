#!/usr/bin/env bash
# One device call (thirty-sixth session): the pruned draft at DeepSeek-V2-Lite 24 GB: specter
# with the calibration's coldest experts pruned from the draft (their INT4 memory buys FP16
# slots) against specter without, one process an arm, 3 HumanEval prompts x 64 tokens; lru
# beside the first arm. PRUNED_ARMS (default "14:specter,lru 21:specter 0:specter") lists
# count:systems; then the CUDA tests of the hot/pruned draft and the kernels' joins.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_pruned_36.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
for arm in ${PRUNED_ARMS:-14:specter,lru 21:specter 0:specter}; do
    count=${arm%%:*}
    systems=${arm#*:}
    tpot_cells 230 24 "$systems" "pruned36-$count-24gb" 3.6 --draft-pruned "$count"
    hot_set_records "$out/bench-deepseek-v2-lite-pruned36-$count-24gb.jsonl"
    echo "== pruned $count at $(($(date +%s) - begin)) s"
done
if [ -z "${SKIP_TESTS:-}" ]; then
    CUDA_TESTS_TIMEOUT=200 cuda_tests_to gpu-tests-pruned.txt \
        packages/specter-models/tests/test_cuda.py -k "hot_set_draft"
    CUDA_TESTS_TIMEOUT=120 cuda_tests_to gpu-tests-pruned.txt \
        packages/specter-kernels/tests/test_gpu.py -k "pair or join or argmax"
    echo "== tests at $(($(date +%s) - begin)) s"
fi
