#!/usr/bin/env bash
# One device call (thirty-eighth session): the capture's argmax warm-up checked. The models'
# CUDA graph tests (with the new first-use test), then scripts/compile_trace_probe.py on a
# fresh Triton cache per configuration (and a second run on the default model's and the
# 24 GB one's filled caches): which kernels each first run's decode still compiles, and its
# TPOT beside the second run's.
#
#   SPECTER_GIT_COMMIT=<hash> bash scripts/gpu_compile_trace_38b.sh   (carry .whl)
# shellcheck source=scripts/gpu-call.sh
source "$(dirname "${BASH_SOURCE[0]}")/gpu-call.sh"
begin=$(date +%s)
cuda_tests_to gpu-tests.txt packages/specter-models/tests/test_cuda.py -k "graph or argmax or capture"
echo "tests at $(($(date +%s) - begin)) s"
python3 -c "from specter_bench.prompt_sources import load_humaneval; \
print(load_humaneval(2)[1].text, end='')" >"$out/prompt.txt"
results=benchmarks/results/bench-deepseek-v2-lite-2026-12-04-cells37-24gb.jsonl
trace() {
    local label=$1 seconds=$2
    shift 2
    echo "=== $label" | tee -a "$out/trace.err"
    timeout "$seconds" python3 scripts/compile_trace_probe.py --out "$out/trace-$label.jsonl" \
        -- --json --no-stream "$@" >/dev/null 2>>"$out/trace.err"
    echo "rc $? at $(($(date +%s) - begin)) s"
    python3 - "$out/trace-$label.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
phases = {}
for r in rows:
    if r["kind"] == "compile":
        p = phases.setdefault(r["phase"], [0, 0.0])
        p[0] += 1
        p[1] += r["seconds"] or 0.0
print({k: (n, round(s, 2)) for k, (n, s) in phases.items()})
for r in rows:
    if r["kind"] == "compile" and r["phase"] == "decode":
        print("  decode:", r["kernel"], round(r["seconds"] or 0, 3), r["frames"][-1:])
g = [r for r in rows if r["kind"] == "generate"]
if g:
    d = g[0]
    print("  tpot", d.get("tpot_ms"), "prefill", d.get("prefill_ms"), "acc", d.get("acceptance_rate"),
          "iters", d.get("iterations"), "capture_s", d.get("graph_capture_s"))
PY
}
fresh() { TRITON_CACHE_DIR=$(mktemp -d); export TRITON_CACHE_DIR; }
dsv2=(--model deepseek-v2-lite --max-new-tokens 64 --prompt-file "$out/prompt.txt")
fresh
trace default-first 200 --max-new-tokens 64
trace default-second 200 --max-new-tokens 64
fresh
trace dsv2-24gb-first 200 "${dsv2[@]}" --gpu-memory-gb 24 --hot-experts "$results"
trace dsv2-24gb-second 200 "${dsv2[@]}" --gpu-memory-gb 24 --hot-experts "$results"
fresh
trace dsv2-24gb-sampled-first 200 "${dsv2[@]}" --gpu-memory-gb 24 --hot-experts "$results" \
    --temperature 0.8 --seed 1
fresh
trace dsv2-10gb-first 200 "${dsv2[@]}" --gpu-memory-gb 10
fresh
trace dsv2-unlimited-first 200 "${dsv2[@]}"
