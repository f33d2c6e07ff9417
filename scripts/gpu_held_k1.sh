#!/usr/bin/env bash
# One device call (twenty-eighth session): the models' streamed CUDA tests in the selection
# that passed in the morning ("stream or budget"; "stream" alone failed four, see
# docs/benchmarks.md); with HELD_AB=1, DeepSeek-V2-Lite at 24 GB with `specter` beside
# `specter-held` at a fixed K = 1 (the adaptive depth wandered apart between the arms of
# gpu_held_copies.sh), one process; then `specter generate` at 24 GB with the CLI's
# defaults and --depth 0.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_held_k1.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
cuda_tests_to gpu-tests.txt packages/specter-models/tests/test_cuda.py -k "stream or budget"
echo "tests done at $(($(date +%s) - begin)) s"
# The K = 1 A/B of specter and specter-held (HELD_AB=1; left out when device time is short).
if [ "${HELD_AB:-0}" = 1 ]; then
    tpot_cells 200 24 specter,specter-held held-k1-24gb 3.0 --depth 1
fi
# The CLI's new default under a budget: plain decoding streamed with fills (what
# specter-plain-fill measured), one HumanEval-like prompt, 64 tokens, statistics as JSON.
timeout 150 python3 -m specter_bench generate --model deepseek-v2-lite --gpu-memory-gb 24 \
    --depth 0 --max-new-tokens 64 --json --no-stream \
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n" \
    >"$out/generate-depth0-24gb.txt" 2>"$out/generate-depth0-24gb.err"
tail -n 1 "$out/generate-depth0-24gb.txt" | cut -c1-900
tail -n 3 "$out/generate-depth0-24gb.err"
echo "generate done at $(($(date +%s) - begin)) s"
