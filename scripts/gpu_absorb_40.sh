#!/usr/bin/env bash
# One device call, written in the thirty-ninth session for the next one (not yet run): the
# queries absorbed in the MLA prologue's launch (SPECTER_MLA_FUSED_ABSORB, off by default)
# and the adaptive depth that no longer learns costs from a generation's first iteration.
# The kernels' MLA CUDA tests and the models' absorption/exactness CUDA tests; DeepSeek-V2-Lite
# unlimited plain decoding (`lru`, 3 HumanEval prompts x 64 tokens), arms in turn: absorbed,
# apart, absorbed; then `specter generate` at 24 GB with the cells37 hot set, --depth auto on a
# fresh depth-costs folder (its first run, then primed), each iteration traced.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_absorb_40.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
CUDA_TESTS_TIMEOUT=60 cuda_tests_to gpu-tests-absorb40.txt \
    packages/specter-kernels/tests/test_gpu.py -k "mla"
CUDA_TESTS_TIMEOUT=150 cuda_tests_to gpu-tests-absorb40.txt \
    packages/specter-models/tests/test_cuda.py \
    -k "absorbed_in_the_prologue or value_projection or mla_prologue or speculation_is_exact"
echo "== tests at $(($(date +%s) - begin)) s"
switch_arms SPECTER_MLA_FUSED_ABSORB absorb absorbed apart
SPECTER_CACHE_DIR=$(mktemp -d)
export SPECTER_CACHE_DIR
humaneval_prompt 1
results=benchmarks/results/bench-deepseek-v2-lite-2026-12-04-cells37-24gb.jsonl
for arm in first primed; do
    iteration_trace "24gb-auto-$arm" 100 --gpu-memory-gb 24 --hot-experts "$results"
    echo "== $arm at $(($(date +%s) - begin)) s"
done
cp "$SPECTER_CACHE_DIR"/depth-costs/*.json "$out/" 2>/dev/null
