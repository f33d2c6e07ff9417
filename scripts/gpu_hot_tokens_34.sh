#!/usr/bin/env bash
# One device call (thirty-fourth session): `specter generate --hot-experts auto` with the hot
# set chosen on the prompt's routing alone (--hot-set-tokens 0, as before) and on the prompt
# and its first 32 greedy tokens (the new default), DeepSeek-V2-Lite at 24 GB, HumanEval/1's
# prompt, 64 tokens, --keep-draft (speculating either way, so only the hot set differs), one
# process a run. Each run's statistics line goes to generate.jsonl, its stderr to generate.err.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_hot_tokens_34.sh   (carry .whl)
#   HOT_SET_TOKENS_ORDER="32 0" ...: the runs in the other order
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
python3 -c "from specter_bench.prompt_sources import load_humaneval; \
print(load_humaneval(2)[1].text, end='')" >"$out/prompt.txt"
for tokens in ${HOT_SET_TOKENS_ORDER:-0 32}; do
    echo "=== --hot-set-tokens $tokens" >>"$out/generate.err"
    timeout 170 python3 -m specter_bench generate --json --no-stream --model deepseek-v2-lite \
        --gpu-memory-gb 24 --max-new-tokens 64 --prompt-file "$out/prompt.txt" --keep-draft \
        --hot-experts auto --hot-set-tokens "$tokens" >"$out/gen.txt" 2>>"$out/generate.err"
    rc=$?
    tail -n 1 "$out/gen.txt" | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); \
d.update(hot_set_tokens=$tokens); print(json.dumps(d))" >>"$out/generate.jsonl"
    tail -n 1 "$out/generate.jsonl" | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); \
print('tokens $tokens rc $rc', {k: d.get(k) for k in ('tpot_ms','mean_depth','acceptance_rate',\
'slots_per_layer','hot_experts_per_layer','h2d_mb_per_token','hit_rate','hot_set_choice_s')})"
    echo "  at $(($(date +%s) - begin)) s"
done
rm -f "$out/gen.txt"
echo "done at $(($(date +%s) - begin)) s"
