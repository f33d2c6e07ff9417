#!/usr/bin/env bash
# One device call (thirty-sixth session), at the session's final code: the DeepSeek-V2-Lite
# 24 GB cells again (specter, lru, spec-lru with the routing experiment's Belady bound; the
# plan's reserve is 512 MiB here), then `specter generate` at 24 GB on HumanEval/1 with its
# default choices (hot set and pruned draft chosen on the prompt, --depth auto) and with
# --draft-pruned 0, one process each; each statistics line goes to generate.jsonl.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_final_36.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
tpot_cells 300 24 specter,lru,spec-lru final36-24gb 4.5 --experiment routing
echo "== DeepSeek 24 GB at $(($(date +%s) - begin)) s"
memory_records "$out/bench-deepseek-v2-lite-final36-24gb.jsonl"
python3 -c "from specter_bench.prompt_sources import load_humaneval; \
print(load_humaneval(2)[1].text, end='')" >"$out/prompt.txt"
for pruned in auto 0; do
    echo "=== --draft-pruned $pruned" >>"$out/generate.err"
    timeout 140 python3 -m specter_bench generate --json --no-stream --model deepseek-v2-lite \
        --gpu-memory-gb 24 --max-new-tokens 64 --prompt-file "$out/prompt.txt" \
        --draft-pruned "$pruned" >"$out/gen.txt" 2>>"$out/generate.err"
    rc=$?
    tail -n 1 "$out/gen.txt" | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); \
d.update(draft_pruned_arg='$pruned'); print(json.dumps(d))" >>"$out/generate.jsonl"
    tail -n 1 "$out/generate.jsonl" | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); \
print('pruned $pruned rc $rc', {k: d.get(k) for k in ('tpot_ms','mean_depth','acceptance_rate',\
'slots_per_layer','hot_experts_per_layer','draft_pruned_per_layer','h2d_mb_per_token',\
'peak_gpu_memory_gb','auto_choice')})"
    echo "  at $(($(date +%s) - begin)) s"
done
rm -f "$out/gen.txt"
