#!/usr/bin/env bash
# One device call (thirty-seventh session): the thirty-sixth session's CPU-only commits on the
# GPU. The models' CUDA tests of the hot-set and pruned drafts; `specter generate` at 24 GB
# with a bench results file (cells37: its hot set and the pruned experts its record names,
# c186d55) on HumanEval/1; `specter generate` at 10 GB, where only a pruned draft fits beside
# one slot a layer (auto prunes there, 345881e), with --depth auto and with --depth 2.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_generate_file_37.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
CUDA_TESTS_TIMEOUT=200 cuda_tests_to gpu-tests-generate-file-37.txt \
    packages/specter-models/tests/test_cuda.py -k "hot or pruned"
echo "== tests at $(($(date +%s) - begin)) s"
python3 -c "from specter_bench.prompt_sources import load_humaneval; \
print(load_humaneval(2)[1].text, end='')" >"$out/prompt.txt"
results=benchmarks/results/bench-deepseek-v2-lite-2026-12-04-cells37-24gb.jsonl
gen() {  # LABEL SECONDS ARGS...: one generate process, its statistics line to generate.jsonl
    local label=$1 seconds=$2
    shift 2
    echo "=== $label" >>"$out/generate.err"
    timeout "$seconds" python3 -m specter_bench generate --json --no-stream \
        --model deepseek-v2-lite --max-new-tokens 64 --prompt-file "$out/prompt.txt" "$@" \
        >"$out/gen.txt" 2>>"$out/generate.err"
    local rc=$?
    tail -n 1 "$out/gen.txt" | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); \
d.update(label='$label'); print(json.dumps(d))" >>"$out/generate.jsonl"
    tail -n 1 "$out/generate.jsonl" | python3 -c "import json,sys; d=json.loads(sys.stdin.read()); \
print('$label rc $rc', {k: d.get(k) for k in ('tpot_ms','mean_depth','acceptance_rate',\
'slots_per_layer','hot_experts_per_layer','draft_pruned_per_layer','h2d_mb_per_token',\
'peak_gpu_memory_gb','auto_choice')})"
    echo "  at $(($(date +%s) - begin)) s"
}
gen file-24gb 150 --gpu-memory-gb 24 --hot-experts "$results"
gen auto-10gb 150 --gpu-memory-gb 10 --depth auto
gen depth2-10gb 150 --gpu-memory-gb 10 --depth 2
rm -f "$out/gen.txt"
