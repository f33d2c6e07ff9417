#!/usr/bin/env bash
# One device call (twenty-ninth session): `specter generate` at DeepSeek-V2-Lite 24 GB with
# its new defaults (a hot set chosen on the prompt, graphs captured ahead); then the targets'
# cells at the session's final code: unlimited (hf, lru, specter) and 24 GB (specter, lru,
# spec-lru), 3 HumanEval prompts x 64 tokens, one process each.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_cells_29.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
prompt="def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"
timeout 150 python3 -m specter_bench generate --json --no-stream --model deepseek-v2-lite \
    --gpu-memory-gb 24 --max-new-tokens 64 "$prompt" \
    >"$out/generate-auto-hot-24gb.txt" 2>"$out/generate-auto-hot-24gb.err"
echo "== generate (rc $?) at $(($(date +%s) - begin)) s"
tail -n 1 "$out/generate-auto-hot-24gb.txt" | cut -c1-900
grep -E "hot set|captured|loaded" "$out/generate-auto-hot-24gb.err" | cut -c1-200
tpot_cells 170 unlimited hf,lru,specter cells29-unlimited 2.6
echo "unlimited done at $(($(date +%s) - begin)) s"
tpot_cells 170 24 specter,lru,spec-lru cells29-24gb 2.4
echo "done at $(($(date +%s) - begin)) s"
