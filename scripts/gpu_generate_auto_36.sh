#!/usr/bin/env bash
# One device call (thirty-sixth session): `specter generate` at DeepSeek-V2-Lite 24 GB on
# HumanEval/1 with its default choices, after --depth auto's comparison weights plain
# decoding's in-place reads (hot_sets.IN_PLACE_READ_COST); statistics to generate.jsonl.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_generate_auto_36.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
python3 -c "from specter_bench.prompt_sources import load_humaneval; \
print(load_humaneval(2)[1].text, end='')" >"$out/prompt.txt"
timeout 150 python3 -m specter_bench generate --json --no-stream --model deepseek-v2-lite \
    --gpu-memory-gb 24 --max-new-tokens 64 --prompt-file "$out/prompt.txt" \
    >"$out/gen.txt" 2>"$out/generate.err"
echo "rc $? at $(($(date +%s) - begin)) s"
tail -n 1 "$out/gen.txt" >"$out/generate.jsonl"
python3 -c "import json; d=json.loads(open('$out/generate.jsonl').read()); \
print({k: d.get(k) for k in ('tpot_ms','mean_depth','acceptance_rate','slots_per_layer',\
'hot_experts_per_layer','draft_pruned_per_layer','h2d_mb_per_token','peak_gpu_memory_gb',\
'auto_choice')})"
grep -E "^(auto|hot set)" "$out/generate.err"
rm -f "$out/gen.txt"
