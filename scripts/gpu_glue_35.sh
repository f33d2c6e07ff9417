#!/usr/bin/env bash
# One device call (thirty-fifth session): the new argmax kernel and the router's selection by
# place on the GPU: their CUDA tests (kernels, and the models' CUDA suite: greedy exactness
# through the adapters, which now take the kernel's argmax), then both timed alone in graphs
# (scripts/decode_glue_probe.py, PDL off and on).
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_glue_35.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
CUDA_TESTS_TIMEOUT=150 cuda_tests_to gpu-tests-glue.txt packages/specter-kernels/tests/test_gpu.py \
    -k "argmax or router"
echo "== kernels' tests at $(($(date +%s) - begin)) s"
CUDA_TESTS_TIMEOUT=300 cuda_tests_to gpu-tests-glue.txt packages/specter-models/tests/test_cuda.py
echo "== models' CUDA tests at $(($(date +%s) - begin)) s"
for pdl in 0 early; do
    SPECTER_KERNELS_PDL=$pdl timeout 100 python3 scripts/decode_glue_probe.py \
        --out "$out/glue-pdl-$pdl.jsonl" >"$out/log-glue-$pdl.txt" 2>&1
    echo "== glue, PDL $pdl (rc $?) at $(($(date +%s) - begin)) s"
    tail -n 8 "$out/log-glue-$pdl.txt"
done
