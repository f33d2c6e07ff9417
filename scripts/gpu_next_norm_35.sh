#!/usr/bin/env bash
# One device call (thirty-fifth session): the MoE join with the next RMSNorm. Its CUDA tests
# (kernels: the join-norm's bits, the argmax; the models' CUDA suite: greedy exactness and
# logits through every path), then DeepSeek-V2-Lite unlimited plain decoding (`lru`: every
# expert resident, no draft probes, so the arms differ by the kernels only), arms in turn: the
# fusion on, off (SPECTER_FUSED_NEXT_NORM=0), on, off. 3 HumanEval prompts x 64 tokens, one
# process an arm. SKIP_TESTS=1 skips the tests (the first call ran them and its arms failed
# on `--depth 0`, which the bench refuses for specter).
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_next_norm_35.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
if [[ -z ${SKIP_TESTS:-} ]]; then
CUDA_TESTS_TIMEOUT=120 cuda_tests_to gpu-tests-next-norm.txt \
    packages/specter-kernels/tests/test_gpu.py -k "join or argmax or residual"
CUDA_TESTS_TIMEOUT=240 cuda_tests_to gpu-tests-next-norm.txt packages/specter-models/tests/test_cuda.py
echo "== tests at $(($(date +%s) - begin)) s"
fi
for arm in on off on2 off2; do
    switch=1
    [[ $arm == off* ]] && switch=0
    SPECTER_FUSED_NEXT_NORM=$switch tpot_cells 100 unlimited lru "next-norm-$arm-unlimited" 1.5
    echo "== $arm at $(($(date +%s) - begin)) s"
done
