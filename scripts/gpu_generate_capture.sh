#!/usr/bin/env bash
# One device call (twenty-ninth session): the CUDA tests of graphs captured ahead; `specter
# generate` with its graphs captured before decoding (the README's first command, then
# DeepSeek-V2-Lite at 24 GB plainly and at the adaptive depth); the held-copy A/B with its
# arms swapped; then Qwen1.5-MoE at 14 GB
# with `specter`, `specter-plain-fill` and `lru`, one process (does streamed plain decoding
# beat the draft there too, as on DeepSeek at 16 GB?).
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_generate_capture.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
cuda_tests_to gpu-tests.txt packages/specter-models/tests/test_cuda.py -k "captured"
echo "tests done at $(($(date +%s) - begin)) s"
gen() {  # gen TAG ARGS...: one generate, its statistics line and last stderr lines
    local tag=$1
    shift
    timeout 150 python3 -m specter_bench generate --json --no-stream "$@" \
        >"$out/generate-$tag.txt" 2>"$out/generate-$tag.err"
    echo "== generate $tag (rc $?) at $(($(date +%s) - begin)) s"
    tail -n 1 "$out/generate-$tag.txt" | cut -c1-700
    grep -E "captured|loaded" "$out/generate-$tag.err" | cut -c1-200
}
gen default
prompt="def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
gen depth0-24gb --model deepseek-v2-lite --gpu-memory-gb 24 --depth 0 --max-new-tokens 64 "$prompt"
gen auto-24gb --model deepseek-v2-lite --gpu-memory-gb 24 --max-new-tokens 64 "$prompt"
# The held-copy A/B again with the arms in the other order (specter-held first), at K = 1
# and at the adaptive depth: the first call ran specter first and found held 3-5% faster.
tpot_cells 150 24 specter-held,specter held-first-k1-24gb 2.2 --depth 1
tpot_cells 150 24 specter-held,specter held-first-auto-24gb 2.2
model_cells qwen1.5-moe 200 14 specter,specter-plain-fill,lru qwen-plain-14gb 3.5
echo "done at $(($(date +%s) - begin)) s"
