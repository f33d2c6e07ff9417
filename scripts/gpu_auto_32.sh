#!/usr/bin/env bash
# One device call (thirty-second session):
# 1. scripts/capture_gc_probe.py again (its arms now let the collector run on its own inside
#    the capture, or pause it, instead of calling gc.collect() in both).
# 2. `specter generate` on HumanEval/1's prompt, 64 tokens, with --depth auto (the default:
#    under a budget it chooses between the draft and plain decoding from the prompt's
#    routing) and with --keep-draft (speculating whatever the replay says), one process a
#    run, in turn: DeepSeek-V2-Lite at 16 GB and 24 GB, Qwen1.5-MoE at 14 GB. Each run's
#    statistics line goes to generate.jsonl, its stderr to generate.err.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_auto_32.sh   (carry .whl)
#   AUTO_CELLS="phi-3.5-moe 32" AUTO_PROBE=0 SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_auto_32.sh
# (AUTO_CELLS: the "model budget" pairs, comma-separated; AUTO_PROBE=0 skips the probe)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
if [ "${AUTO_PROBE:-1}" != 0 ]; then
    timeout 60 python3 scripts/capture_gc_probe.py --out "$out/capture-gc.jsonl" 2>&1 | grep kind
    echo "probe done at $(($(date +%s) - begin)) s"
fi
python3 -c "from specter_bench.prompt_sources import load_humaneval; \
print(load_humaneval(2)[1].text, end='')" >"$out/prompt.txt"
generate_run() {
    local model=$1 budget=$2 arm=$3
    shift 3
    echo "=== $model $budget GB $arm" >>"$out/generate.err"
    timeout "${AUTO_TIMEOUT:-150}" python3 -m specter_bench generate --json --no-stream --model "$model" \
        --gpu-memory-gb "$budget" --max-new-tokens 64 --prompt-file "$out/prompt.txt" "$@" \
        >"$out/gen.txt" 2>>"$out/generate.err"
    local rc=$?
    tail -n 1 "$out/gen.txt" | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); \
d.update(model='$model', budget_gb=$budget, arm='$arm'); print(json.dumps(d))" \
        >>"$out/generate.jsonl"
    tail -n 1 "$out/generate.jsonl" | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); \
print('$model $budget $arm rc $rc', {k: d.get(k) for k in ('tpot_ms','mean_depth','acceptance_rate',\
'slots_per_layer','hot_experts_per_layer','h2d_mb_per_token')}, (d.get('auto_choice') or {}).get('decoded'))"
    echo "  at $(($(date +%s) - begin)) s"
}
IFS=, read -r -a cells <<<"${AUTO_CELLS:-deepseek-v2-lite 16,qwen1.5-moe 14,deepseek-v2-lite 24}"
for cell in "${cells[@]}"; do
    # shellcheck disable=SC2086
    generate_run $cell auto
    # shellcheck disable=SC2086
    generate_run $cell keep-draft --keep-draft
done
rm -f "$out/gen.txt"
echo "done at $(($(date +%s) - begin)) s"
