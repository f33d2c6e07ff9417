#!/usr/bin/env bash
# One device call (thirty-first session): at the low budgets of DeepSeek-V2-Lite (16 GB) and
# Qwen1.5-MoE (14 GB), `specter`, `specter-plain-pipe` and `lru` side by side (one process
# each model, 3 HumanEval prompts x 64 tokens), and `specter generate` with --depth auto
# (the default) on HumanEval/1's prompt: whether it chose plain decoding, and its TPOT.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_auto_31.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
python3 -c "from specter_bench.prompt_sources import load_humaneval; \
print(load_humaneval(2)[1].text, end='')" >"$out/prompt.txt"
auto_generate() {
    local model=$1 budget=$2
    timeout 150 python3 -m specter_bench generate --json --no-stream --model "$model" \
        --gpu-memory-gb "$budget" --max-new-tokens 64 --prompt-file "$out/prompt.txt" \
        >"$out/generate-auto-$model-${budget}gb.txt" 2>"$out/generate-auto-$model-${budget}gb.err"
    echo "== generate $model $budget GB (rc $?) at $(($(date +%s) - begin)) s"
    grep -E "^auto:|hot set|loaded" "$out/generate-auto-$model-${budget}gb.err" | cut -c1-260
    tail -n 1 "$out/generate-auto-$model-${budget}gb.txt" | python3 -c "import json,sys; \
d=json.loads(sys.stdin.read()); print({k: d.get(k) for k in ('tpot_ms','mean_depth',\
'slots_per_layer','hot_experts_per_layer','h2d_mb_per_token','auto_choice')})"
}
tpot_cells 200 16 specter,specter-plain-pipe,lru auto31-16gb 3.0
echo "DeepSeek 16 GB done at $(($(date +%s) - begin)) s"
auto_generate deepseek-v2-lite 16
model_cells qwen1.5-moe 150 14 specter,specter-plain-pipe,lru auto31-qwen-14gb 2.2
echo "Qwen 14 GB done at $(($(date +%s) - begin)) s"
auto_generate qwen1.5-moe 14
echo "done at $(($(date +%s) - begin)) s"
